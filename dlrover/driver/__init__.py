"""The driver side of a job: run it here, submit it to a cluster, watch and drain it, a local head."""
