"""Networks, registered by the name a spec gives in agent.net.type."""
from slm_lab.agent.net.mlp import MLPNet

NETS = {'MLPNet': MLPNet}
# SLM-Lab names that come in a later version: validation says so instead of "unknown"
PLANNED_NETS = ('ConvNet', 'RecurrentNet')
