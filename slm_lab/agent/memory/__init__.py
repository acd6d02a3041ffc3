"""Memories, registered by the name a spec gives in agent.memory.name."""
from slm_lab.agent.memory.onpolicy import OnPolicyBatchReplay, OnPolicyReplay
from slm_lab.agent.memory.replay import Replay

MEMORIES = {'OnPolicyReplay': OnPolicyReplay, 'OnPolicyBatchReplay': OnPolicyBatchReplay, 'Replay': Replay}
# SLM-Lab names that come in a later version: validation says so instead of "unknown"
PLANNED_MEMORIES = ('PrioritizedReplay', 'OnPolicyCrossEntropy')
# keys SLM-Lab reads only in memories or algorithms of a later version, and what they are
PLANNED_KEYS = {
    'alpha': "prioritized replay (SLM-Lab's PrioritizedReplay)",
    'epsilon': "prioritized replay (SLM-Lab's PrioritizedReplay)",
    'cross_entropy': "SLM-Lab's OnPolicyCrossEntropy memory",
}
