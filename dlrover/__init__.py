"""dlrover-ray: elastic DLRM training on Ray."""
__version__ = "0.1.0"
