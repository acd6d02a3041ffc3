"""Where bfloat16 pays on this CPU: one linear layer's products in float32 and in bf16, by shape.

    python bench/bf16_products.py --cpu 1
    python bench/bf16_products.py --cpu 1 --shapes 256:256:256,1:17:256

For each shape (rows B, inputs I, outputs O) the three products of a linear layer in a training
step, each timed in float32 and in bfloat16 the way autocast (agent.net.precision "bf16") runs
them, the casts of its float32 operands included:
  forward   y = x W^T + b            (B x I times I x O)
  input     dx = dy W                (the gradient for the layer below; B x O times O x I)
  weight    dW = dy^T x              (O x B times B x I)
one thread, the two precisions alternating call by call (a drift of the machine's speed hits
both), median of --repeats calls after 5 warm-up calls, in microseconds. The default shapes are
the rows' layers: SAC HalfCheetah's (batch 256; acting at batch 1), PPO Hopper's 64-wide ones
(minibatch 64), and the Nature CNN's dense layer (PPO Pong's minibatch 256, acting over 8 envs).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from pinning import add_cpu_arg, pin  # bench/ (not a package) is on sys.path

SHAPES = ('256:17:256,256:23:256,256:256:256,256:256:1,256:256:12,1:17:256,1:256:256,1:256:6,'
          '64:11:64,64:64:64,256:3136:512,8:3136:512')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--shapes', default=SHAPES, help='B:I:O,... (rows, inputs, outputs)')
    parser.add_argument('--repeats', type=int, default=100)
    add_cpu_arg(parser)
    args = parser.parse_args(argv)
    where = pin(args.cpu)
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    bf16 = torch.bfloat16

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6

    print(f'# {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} | {where} | median of {args.repeats} calls, us')
    print(f'{"B":>5} {"I":>5} {"O":>5} | {"forward":>21} | {"input grad":>21} | {"weight grad":>21} | all three')
    print(f'{"":>17} | ' + ' | '.join([f'{"fp32":>7} {"bf16":>7} {"ratio":>5}'] * 3) + ' | fp32/bf16')
    for shape in args.shapes.split(','):
        b, i, o = (int(v) for v in shape.split(':'))
        x, w, bias, dy = torch.randn(b, i), torch.randn(o, i), torch.randn(o), torch.randn(b, o)
        xb, wb, dyb = x.to(bf16), w.to(bf16), dy.to(bf16)  # the backward's operands autocast already cast
        pairs = {
            'forward': (lambda: F.linear(x, w, bias), lambda: F.linear(x.to(bf16), w.to(bf16), bias.to(bf16))),
            'input': (lambda: dy @ w, lambda: dyb @ wb),
            'weight': (lambda: dy.t() @ x, lambda: dyb.t() @ xb),
        }
        medians = {}
        for name, (f32, b16) in pairs.items():
            times = {'fp32': [], 'bf16': []}
            for k in range(args.repeats + 5):
                a, c = timed(f32), timed(b16)
                if k >= 5:
                    times['fp32'].append(a)
                    times['bf16'].append(c)
            medians[name] = (statistics.median(times['fp32']), statistics.median(times['bf16']))
        cells = ' | '.join(f'{f:>7.1f} {h:>7.1f} {f / h:>4.2f}x' for f, h in medians.values())
        total_f, total_h = (sum(m[k] for m in medians.values()) for k in (0, 1))
        print(f'{b:>5} {i:>5} {o:>5} | {cells} | {total_f / total_h:>8.2f}x')
    return 0


if __name__ == '__main__':
    sys.exit(main())
