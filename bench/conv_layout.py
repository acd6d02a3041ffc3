"""The Nature CNN's forward and backward in each memory layout (agent.net.memory_format), on one
thread: milliseconds per call and the channels_last / contiguous ratio, per batch size.

    python bench/conv_layout.py                     # batches 1, 8, 32, 256; fp32
    python bench/conv_layout.py --bf16 --cpu 1      # also under bf16 autocast (agent.net.precision), pinned

The net is the lab's ConvNet as the Atari specs build it (conv [32,8,4] [64,4,2] [64,3,1], dense
512, one head of 6), its input 4 stacked 84x84 uint8 frames, prepared (cast, /255, layout) inside
the timed call as a training step does. Each figure is the median of --repeats calls after 3
warm-up calls; the layouts alternate call by call, so a drift of the machine's speed hits both.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

from pinning import add_cpu_arg, pin  # bench/ (not a package) is on sys.path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(layout: str):
    from slm_lab.agent.net import build_net
    from slm_lab.agent.net.conv import NATURE_CONV
    from slm_lab.spec import validate_spec
    spec = {'agent': {'name': 'DQN', 'algorithm': {'name': 'DQN'}, 'memory': {'name': 'Replay'},
                      'net': {'type': 'ConvNet', 'conv_hid_layers': NATURE_CONV, 'fc_hid_layers': [512],
                              'batch_norm': False, 'normalize': True, 'memory_format': layout}},
            'env': {'name': 'ALE/Pong-v5', 'max_frame': 100}, 'meta': {}}
    return build_net(validate_spec(spec)['agent']['net'], (4, 84, 84), 6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batches', default='1,8,32,256')
    parser.add_argument('--repeats', type=int, default=20)
    parser.add_argument('--bf16', action='store_true', help='also time each layout under bf16 autocast')
    add_cpu_arg(parser)
    args = parser.parse_args(argv)
    where = pin(args.cpu)
    warnings.filterwarnings('ignore')
    import torch
    torch.manual_seed(0)
    nets = {layout: build(layout) for layout in ('contiguous', 'channels_last')}
    nets['channels_last'].load_state_dict(nets['contiguous'].state_dict())
    precisions = ['fp32', 'bf16'] if args.bf16 else ['fp32']
    print(f'# {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} | {where} | median of {args.repeats} calls, ms')
    print(f'{"batch":>5} {"precision":>9} {"pass":>9} {"contiguous":>11} {"channels_last":>14} {"ratio":>6}')
    for batch in [int(b) for b in args.batches.split(',')]:
        frames = torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8)
        for precision in precisions:
            for kind in ('forward', 'fwd+bwd'):
                times = {layout: [] for layout in nets}
                for i in range(args.repeats + 3):
                    for layout, net in nets.items():
                        t0 = time.perf_counter()
                        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=precision == 'bf16'):
                            if kind == 'forward':
                                with torch.no_grad():
                                    net(frames)
                            else:
                                net(frames).float().sum().backward()
                        if i >= 3:
                            times[layout].append((time.perf_counter() - t0) * 1e3)
                        net.zero_grad(set_to_none=True)
                a, b = (statistics.median(times[k]) for k in ('contiguous', 'channels_last'))
                print(f'{batch:>5} {precision:>9} {kind:>9} {a:>11.3f} {b:>14.3f} {a / b:>5.2f}x')
    return 0


if __name__ == '__main__':
    sys.exit(main())
