"""Networks, registered by the name a spec gives in agent.net.type."""
from slm_lab.agent.net.mlp import MLPNet

NETS = {'MLPNet': MLPNet}
# SLM-Lab names that come in a later version: validation says so instead of "unknown"
PLANNED_NETS = ('ConvNet', 'RecurrentNet', 'DuelingMLPNet', 'DuelingConvNet', 'HydraMLPNet', 'TorchArcNet')
# keys SLM-Lab reads only in nets of a later version, and what they are
PLANNED_KEYS = {
    'conv_hid_layers': "convolutional layers (SLM-Lab's ConvNet)",
    'fc_hid_layers': "the dense layers of SLM-Lab's ConvNet and RecurrentNet",
    'cell_type': "recurrent nets (SLM-Lab's RecurrentNet)",
    'rnn_hidden_size': "recurrent nets (SLM-Lab's RecurrentNet)",
    'rnn_num_layers': "recurrent nets (SLM-Lab's RecurrentNet)",
    'seq_len': "recurrent nets (SLM-Lab's RecurrentNet)",
    'bidirectional': "recurrent nets (SLM-Lab's RecurrentNet)",
    'arc': "architectures described in the spec (SLM-Lab v5's TorchArcNet)",
    'arc_file': "architectures described in the spec (SLM-Lab v5's TorchArcNet)",
}
