"""Pallas GPU kernels of hyquant-jax. They take plain arrays and block sizes and
know nothing about models or caches; each has a pure-jnp reference in
`hyquant_jax.reference` that the tests compare it with."""
