"""Algorithms, registered by the name a spec gives in agent.algorithm.name.

Adding an algorithm = one module with an Algorithm subclass, listed here.
"""
from slm_lab.agent.algorithm.dqn import DQN, DoubleDQN, VanillaDQN
from slm_lab.agent.algorithm.ppo import PPO
from slm_lab.agent.algorithm.random import Random
from slm_lab.agent.algorithm.reinforce import Reinforce

ALGORITHMS = {cls.__name__: cls for cls in (Random, Reinforce, VanillaDQN, DQN, DoubleDQN, PPO)}
# SLM-Lab names that come in a later version: validation says so instead of "unknown"
PLANNED_ALGORITHMS = ('SARSA', 'ActorCritic', 'A2C', 'SoftActorCritic', 'DDQN', 'HydraDQN', 'SIL', 'PPOSIL', 'CrossQ')
# keys SLM-Lab reads only in algorithms of a later version, and what they are: an algorithm here
# that meets one refuses it with the "not available yet" line, not as an unknown key
PLANNED_KEYS = {
    'num_step_returns': "n-step returns (SLM-Lab's ActorCritic and SIL)",
    'policy_loss_coef': "the policy loss weight of SLM-Lab's ActorCritic and SIL",
    'sil_policy_loss_coef': "self-imitation learning (SLM-Lab's SIL and PPOSIL)",
    'sil_val_loss_coef': "self-imitation learning (SLM-Lab's SIL and PPOSIL)",
    # read by SLM-Lab v5's SoftActorCritic (and CrossQ) only, in its code (not in its published specs)
    **{key: f"{what} (SLM-Lab v5's SoftActorCritic)" for key, what in (
        ('policy_delay', 'delayed policy updates'),
        ('entropy_penalty_coef', 'the entropy penalty'),
        ('log_alpha_min', 'the bounds of the entropy temperature'),
        ('log_alpha_max', 'the bounds of the entropy temperature'),
        ('alpha_lr', 'the learning rate of the entropy temperature'),
        ('fixed_alpha', 'a fixed entropy temperature'),
        ('alpha_anneal_frames', 'annealing of the entropy temperature'),
        ('target_entropy', 'the target entropy'),
        ('entropy_anneal', 'annealing of the target entropy'),
        ('spectral_norm', 'spectral normalisation of the critic'),
    )},
}
