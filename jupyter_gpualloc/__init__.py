def load_ipython_extension(ipython):
    """`%load_ext jupyter_gpualloc`: the `%gpu` magic (see jupyter_gpualloc.kernel)."""
    from .kernel import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    """`%unload_ext jupyter_gpualloc`."""
    from .kernel import unload_ipython_extension as unload

    unload(ipython)


def _jupyter_labextension_paths():
    """The prebuilt JupyterLab extension (the GPUs panel), for `jupyter labextension develop`."""
    return [{"src": "labextension", "dest": "jupyter-gpualloc"}]
