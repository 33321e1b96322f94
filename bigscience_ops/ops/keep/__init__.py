"""Keep: a run's logs and checkpoints kept off the cluster: Hub sync (hubsync.py, with git and git-lfs in
gitlfs.py), verified checkpoint backups and scratch retention (backup.py; the store they go to, store.py), and the run's chronicle
(chronicle.py), which hub-sync pushes with the logs."""
