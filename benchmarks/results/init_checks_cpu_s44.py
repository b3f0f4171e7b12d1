"""Session 44's CPU checks of init_params (run from the repo root with PYTHONPATH=.):
(1) no jax.Array besides the weights stays alive after the initialization (3 layers of Qwen3-8B's shape);
(2) the compiled init draws what the op-by-op init drew: count of elements that differ (smoke model)."""
import gc, json, sys
import jax, jax.numpy as jnp, numpy as np
from benchmarks import e2e
from models import init_params
from models.transformer import init_layer_params, init_outer_params

def op_by_op(key, config):
    """init_params as it was before session 44 (not compiled)."""
    keys = jax.random.split(key, config.num_layers + 3)
    return (tuple(init_layer_params(keys[i], config, jnp.bfloat16) for i in range(config.num_layers)),
            init_outer_params(keys[-3:], config, jnp.bfloat16))


out = {"jax": jax.__version__, "platform": jax.devices()[0].platform}
config = e2e._model(e2e.parse_args(["--sections", "b1", "--layers", "3"]))
for name, init in (("op_by_op", lambda: op_by_op(jax.random.PRNGKey(0), config)),
                   ("compiled", lambda: init_params(jax.random.PRNGKey(0), config, jnp.bfloat16))):
    p = jax.block_until_ready(init())
    gc.collect()
    ids = {id(x) for x in jax.tree_util.tree_leaves(p)}
    extra = [x for x in jax.live_arrays() if id(x) not in ids]
    out[name] = {"weights_bytes_3_layers": sum(x.nbytes for x in jax.tree_util.tree_leaves(p)),
                 "extra_live_arrays": len(extra), "extra_live_bytes": sum(x.nbytes for x in extra)}
    del p, extra
config = e2e._model(e2e.parse_args(["--sections", "b1", "--smoke"]))
compiled = init_params(jax.random.PRNGKey(0), config, jnp.bfloat16)
eager = op_by_op(jax.random.PRNGKey(0), config)
got = jax.tree_util.tree_leaves((compiled.layers, (compiled.embed, compiled.final_norm, compiled.lm_head)))
want = jax.tree_util.tree_leaves(eager)
a = np.concatenate([np.asarray(x, np.float32).ravel() for x in got])
b = np.concatenate([np.asarray(x, np.float32).ravel() for x in want])
out["smoke_model"] = dict(elements=int(a.size), differing=int((a != b).sum()),
                          max_abs_difference=float(np.abs(a - b).max()))
json.dump(out, sys.stdout, indent=1)
