"""Algorithms, registered by the name a spec gives in agent.algorithm.name.

Adding an algorithm = one module with an Algorithm subclass, listed here.
"""
from slm_lab.agent.algorithm.dqn import DQN, DoubleDQN, VanillaDQN
from slm_lab.agent.algorithm.ppo import PPO
from slm_lab.agent.algorithm.random import Random
from slm_lab.agent.algorithm.reinforce import Reinforce

ALGORITHMS = {cls.__name__: cls for cls in (Random, Reinforce, VanillaDQN, DQN, DoubleDQN, PPO)}
# SLM-Lab names that come in a later version: validation says so instead of "unknown"
PLANNED_ALGORITHMS = ('SARSA', 'ActorCritic', 'A2C', 'SoftActorCritic', 'DDQN', 'HydraDQN')
