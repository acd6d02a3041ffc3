"""What a run keeps on disk and how it is read back: the format of one snapshot (snapshot.py, its
array files through lib/arrays.py; tmpfiles.py), a session's snapshots, the ones it can continue
from past damaged ones, and the Snapshot class, the one accessor of a snapshot's parts
(snapshots.py), model files, run directories, env state, resume resolution and checks (resume.py, edits.py).

Nothing is imported here: `from slm_lab.persistence.run_dir import RunDir` must not import torch.
"""
