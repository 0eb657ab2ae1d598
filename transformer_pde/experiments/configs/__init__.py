"""Each experiment's entry, one module per experiment: its options (a frozen dataclass of
:class:`~transformer_pde.experiments._options.Options`), the constants those read, and the
:func:`~transformer_pde.experiments.register` call naming its summary, tiny size and, through
:class:`~transformer_pde.experiments.Deferred`, its computation. Light by rule: an entry imports no
JAX, so ``transformer-pde list`` and ``--help`` read every entry and load no computation."""
