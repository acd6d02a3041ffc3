"""search mode: an experiment of trials on Ray Tune, values drawn by Optuna, early stopping by ASHA.

The run directory is the whole state of a search, so a search resumes the way a run does:

  {name}_spec.json                    the spec with its search block
  {name}_t{i}_spec.json               trial i's spec: the values it drew set in place
  info/, model/, ckpt/, log/, graph/  the trials' sessions, as train writes them (prefix _t{i})
  search/optuna.journal               the Optuna study: every trial's draw and outcome
  search/tune/                        Ray Tune's own files (results, trial logs)
  info/{name}_experiment_df.csv       one row per trial: values, metrics, status

Each trial runs as a child process of its Ray worker (`python -m slm_lab.experiment.search.trial`),
so it is an ordinary Trial with its signal handling and snapshots; the Ray trainable reports the
rows of the trial's train CSVs to Tune (frame, total_reward_ma) as they appear. Optuna draws trial
i with a sampler seeded from (meta.random_seed, i) given the trials before it, so a resumed search
draws what an uninterrupted one would have; on resume the finished trials are replayed to Tune from
their CSVs (ASHA sees the same history) and the unfinished ones continue from their snapshots.

The package (this file imports none of it: a caller imports the module it uses, and a process
started as `python -m slm_lab.experiment.search.trial` loads only what that module imports):
space.py (the search block's syntax: parameters and grids), specs.py (the search block's
parameters, the trials' specs, a resumed search's spec), study.py (Optuna's draws, the trials'
records), tune.py (the searcher, the trainable, the stop files), driver.py (Ray, the scheduler,
the experiment's records), processes.py (the trials' processes, started ahead), watch.py (the
console lines), and the processes of their own: trial.py (one trial), ray_head.py (the search's
local Ray, in a session of its own), reaper.py (the watchdog that leaves no Ray process behind).
"""
