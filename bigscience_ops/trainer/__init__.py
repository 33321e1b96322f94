"""The bundled trainer: Megatron's GPT on DeepSpeed pipeline parallelism, run as `python -m bigscience_ops.trainer`.

Importing this package imports nothing heavy; torch and deepspeed load in the submodules.
"""
