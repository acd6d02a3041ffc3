"""Algorithms, registered by the name a spec gives in agent.algorithm.name.

Adding an algorithm = one module with an Algorithm subclass, listed here.
"""
from slm_lab.agent.algorithm.actor_critic import ActorCritic
from slm_lab.agent.algorithm.crossq import CrossQ
from slm_lab.agent.algorithm.dqn import DQN, DoubleDQN, VanillaDQN
from slm_lab.agent.algorithm.ppo import PPO
from slm_lab.agent.algorithm.random import Random
from slm_lab.agent.algorithm.reinforce import Reinforce
from slm_lab.agent.algorithm.sarsa import SARSA
from slm_lab.agent.algorithm.sac import SoftActorCritic
from slm_lab.agent.algorithm.sac_discrete import DiscreteSAC, RelaxedSAC  # noqa: F401 (SoftActorCritic's for Discrete actions)
from slm_lab.agent.algorithm.sil import PPOSIL, SIL
from slm_lab.agent.algorithm.td3 import TD3

ALGORITHMS = {cls.__name__: cls for cls in (Random, Reinforce, SARSA, VanillaDQN, DQN, DoubleDQN, ActorCritic, PPO, SIL,
                                            PPOSIL, SoftActorCritic, CrossQ, TD3)}
# SLM-Lab names that come in a later version: validation says so instead of "unknown"
PLANNED_ALGORITHMS = ('HydraDQN',)
