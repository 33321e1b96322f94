"""A job planned, written and submitted: training, the eval job and the hourly runner go out the same way.

- plan.py: the immutable LaunchPlan and the Executor protocol that carries one out.
- render.py: Experiment -> the Slurm job script and the DeepSpeed JSON.
- jobenv.py: the environment a job script starts in (Slurm and local alike).
- local.py: the local executor (the job array run on this machine).
- cluster.py: the Slurm executor (sbatch, never overlapping a running training).
- console.py: what a local launch tells on the console.
"""
