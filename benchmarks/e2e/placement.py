"""Where the end-to-end benchmark's arrays live: the device mesh of --mesh (or one device), arrays put on it,
and the peak memory over its devices."""

from __future__ import annotations


def device_mesh(args):
    """The worker's device mesh (None: one device)."""
    if not args.mesh:
        return None
    from hyquant_jax.sharding import make_mesh

    return make_mesh(args.mesh)


def data_size(mesh) -> int:
    if mesh is None:
        return 1
    from hyquant_jax.sharding import mesh_sizes

    return mesh_sizes(mesh)[0]


def mesh_devices(mesh) -> list:
    import jax

    return [jax.devices()[0]] if mesh is None else list(mesh.devices.flat)


def peak_bytes(mesh=None) -> int | None:
    """Peak memory in use, the largest over the devices (None when the platform does not report it)."""
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in mesh_devices(mesh)]
    peaks = [p for p in peaks if p is not None]
    return max(peaks) if peaks else None


def put(x, mesh, batch_axis=True):
    """x on the mesh: split over "data" along axis 0 (or replicated); as is without a mesh."""
    if mesh is None:
        return x
    from hyquant_jax import sharding

    return sharding.put_batch(x, mesh) if batch_axis else sharding.put_replicated(x, mesh)
