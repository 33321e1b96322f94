"""bigscience-ops: run months-long GPT pretraining on Slurm without babysitting it."""

__version__ = "0.1.0"
