import jax

# Validate in float64 (STYLE.md): every test runs with x64 enabled; float32 behaviour is
# checked by passing float32 arrays explicitly.
jax.config.update("jax_enable_x64", True)
