"""The attention family: every variant maps a measure μ to a velocity field Γ_μ (one module per family;
the capabilities in :mod:`.base`). Their public names are :mod:`transformer_pde.models`' (its stub
``__init__.pyi``)."""
