"""Memories, registered by the name a spec gives in agent.memory.name.

Adding a memory = one module with a Memory subclass (its spec_schema, build_args, storage_needs;
replays' sample() returns a Batch), listed here.
"""
from slm_lab.agent.memory.base import Batch, Memory
from slm_lab.agent.memory.onpolicy import OnPolicyBatchReplay, OnPolicyCrossEntropy, OnPolicyReplay
from slm_lab.agent.memory.prioritized import PrioritizedReplay
from slm_lab.agent.memory.replay import Replay

MEMORIES = {'OnPolicyReplay': OnPolicyReplay, 'OnPolicyBatchReplay': OnPolicyBatchReplay, 'Replay': Replay,
            'PrioritizedReplay': PrioritizedReplay, 'OnPolicyCrossEntropy': OnPolicyCrossEntropy}
# SLM-Lab names that come in a later version: validation says so instead of "unknown"
PLANNED_MEMORIES = ()

__all__ = ['Batch', 'MEMORIES', 'Memory', 'OnPolicyBatchReplay', 'OnPolicyCrossEntropy', 'OnPolicyReplay',
           'PLANNED_MEMORIES', 'PrioritizedReplay', 'Replay']
