"""The base of on-policy algorithms: store each vector step, train on the memory's batch when due.

An on-policy algorithm learns from the steps its current policy just took: it adds each vector
step to an OnPolicyBatchReplay (a fixed batch of vector steps) or an OnPolicyReplay (whole
episodes), and once the batch is complete, or enough episodes have finished, it trains once on
what the memory hands over (which empties it). Subclasses give `train_batch`, and override
`train_due` when their batch is complete otherwise.
"""
from __future__ import annotations

from slm_lab.agent.algorithm.base import Algorithm
from slm_lab.agent.memory.onpolicy import EpisodeBatch, OnPolicyBatchReplay, RolloutBatch


class OnPolicyAlgorithm(Algorithm):
    """Store, then train on the memory's batch when `train_due`; `training_frequency` counts
    vector steps (OnPolicyBatchReplay) or finished episodes (OnPolicyReplay)."""

    training_frequency: int = 1

    def update(self, obs, action, reward, next_obs, terminated, truncated) -> dict | None:
        """Store one vector step; when a batch is due, train on it (see train_batch)."""
        self.memory.add(obs, action, reward, next_obs, terminated, truncated)
        if not self.train_due():
            return None
        return self.train_batch(self.memory.sample())

    def train_due(self) -> bool:
        """Whether the memory holds a training batch: training_frequency vector steps
        (OnPolicyBatchReplay) or finished episodes (OnPolicyReplay)."""
        if isinstance(self.memory, OnPolicyBatchReplay):
            return self.memory.size >= self.training_frequency
        return self.memory.num_finished >= self.training_frequency

    def train_batch(self, batch: RolloutBatch | EpisodeBatch) -> dict | None:
        """One update on the batch the memory handed over: a RolloutBatch (T, N, ...) from an
        OnPolicyBatchReplay, an EpisodeBatch (T, ...) of whole episodes from an OnPolicyReplay.
        Returns the training metrics, or None when it did not train."""
        raise NotImplementedError
