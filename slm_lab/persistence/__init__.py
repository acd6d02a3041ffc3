"""What a run keeps on disk and how it is read back: the format of one snapshot (snapshot.py,
arrays.py, tmpfiles.py), a session's snapshots and the ones it can continue from, past damaged
ones (snapshots.py), the Snapshot class and the one accessor of a snapshot's parts (state.py),
model files, run directories, env state, resume resolution and checks (resume.py, edits.py).

Nothing is imported here: `from slm_lab.persistence.run_dir import RunDir` must not import torch.
"""
