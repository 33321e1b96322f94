"""A job planned, written and submitted: training, the eval job and the hourly runner go out the same way.

- jobs.py: the Executor protocol every job goes through, the one sbatch call (`jobs.submit`), the executors of a
  plain job script (Slurm, local) and the SlurmJob handle (queued, running, gone; cancel).
- processes.py: a job run on this machine: its process group, the LocalJob handle and the one process-tree stop.
- plan.py: the immutable LaunchPlan of a training and `execute`, which carries it out with an executor.
- render.py: Experiment -> the Slurm job script and the DeepSpeed JSON.
- jobenv.py: the environment a job script starts in (Slurm and local alike).
- local.py: the training's local executor (the job array run on this machine).
- cluster.py: the training's Slurm executor (sbatch, never overlapping a running training).
- console.py: what a local launch tells on the console.
"""
