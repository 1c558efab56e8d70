"""The Python API a data scientist uses from a script or a notebook: ``run`` a spec here,
``submit`` it to a cluster, and a ``JobResult`` to read; the CLI is a thin layer over it.
The names are re-exported at the package top (``dlrover.run``)."""
