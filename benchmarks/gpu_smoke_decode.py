import jax, jax.numpy as jnp, numpy as np, time
import hyquant_jax as hq
from hyquant_jax.decode_kernel import decode_attention as kd
cfg = hq.HyQuantConfig()
B,Hq,Hkv,N,D = 2,32,8,3000,128
ks = jax.random.split(jax.random.PRNGKey(0), 4)
k = jax.random.normal(ks[1], (B,Hkv,N,D), jnp.bfloat16); v = jax.random.normal(ks[2], (B,Hkv,N,D), jnp.bfloat16)
qt = jax.random.normal(ks[0], (B,Hq,128,D), jnp.bfloat16)
lens = jnp.array([3000, 1777], jnp.int32)
c = hq.freeze(k, v, lens, qt, cfg, max_len=4096)
q = jax.random.normal(ks[3], (B,Hq,D), jnp.bfloat16)
t=time.time(); out, lse = kd(q, c, cfg); out.block_until_ready(); print("compile+run", time.time()-t)
ref, _ = hq.hybrid_decode_attention_reference(q.astype(jnp.float32), c, cfg)
print("smoke rel err", float(jnp.linalg.norm(out.astype(jnp.float32)-ref)/jnp.linalg.norm(ref)), "finite", bool(jnp.all(jnp.isfinite(out))))
