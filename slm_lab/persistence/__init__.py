"""What a run keeps on disk and how it is read back: the snapshot format (snapshot.py, arrays.py,
snapshots.py, tmpfiles.py), the one accessor of a snapshot's parts (state.py), model files,
run directories, env state, resume resolution and checks (resume.py, edits.py) and the fallback
past damaged snapshots (fallback.py).

Nothing is imported here: `from slm_lab.persistence.run_dir import RunDir` must not import torch.
"""
