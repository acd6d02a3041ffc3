"""SLM-Lab compatibility: what SLM-Lab's v4 and v5 spec files hold that the lab reads its own way.
v4's layout (list-wrapped agent and env, the body block) is flattened before validation, a v4
spec's DQN getting v4's targets (V4_ALGORITHM_KEYS: keys whose default v5 changed), and gymnasium
ids renamed since SLM-Lab's specs were written run as their current ids. The keys and names
SLM-Lab has that wait for a later component are declared where that component will live
(`planned`, the PLANNED_* registries of the agent packages, net's PLANNED_KEYS, ENV_PLANNED_KEYS in
slm_lab.env.schema) and refused by the validator with `lib.schema.not_available`."""
from slm_lab.spec.compat.env_ids import RENAMED_ENV_IDS, current_env_id, rename_env_id
from slm_lab.spec.compat.v4_layout import (V4_ALGORITHM_KEYS, V4_BODY_PRODUCTS, flatten_v4_layout, is_v4_layout,
                                          raw_section)

__all__ = ['RENAMED_ENV_IDS', 'V4_ALGORITHM_KEYS', 'V4_BODY_PRODUCTS', 'current_env_id', 'flatten_v4_layout',
           'is_v4_layout', 'raw_section', 'rename_env_id']
