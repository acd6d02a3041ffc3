"""Training without importing torch's compiler. torch imports torch._dynamo (as long to import as
torch itself: 0.9 s of a process's start on this project's machine, docs/development.md) the
first time an optimizer calls one of the four methods torch wraps with torch._disable_dynamo
(add_param_group, which every optimizer's constructor calls, zero_grad, state_dict,
load_state_dict), and at every opt.step() (its grad-mode wrapper calls torch._dynamo.graph_break).
The lab compiles nothing, and a process that has not imported the compiler is compiling nothing:
there, telling the compiler to leave these methods alone changes nothing but the start-up time.

`defer()` makes each of the four wrappers call its method directly until the compiler is loaded;
once it is (a user who compiles in the same process, any import of torch._dynamo), the wrapper is
torch's own again from its next call. The steps are optim_steps.step_optimizer's: torch's own step
function of the optimizer's class, not through opt.step()'s wrappers, wherever there are no step
hooks (meta.distributed's global nets have some: their optimizers import the compiler at their
first step, as before). Every number is the same either way.

It works through where torch's wrapper keeps its result: `fn.__dynamo_disable` on the wrapped
function (torch/_compile.py, torch 2.x). A torch whose wrappers look otherwise is left as it is
(it imports its compiler, as before, and trains the same); test/agent/test_compiler_import.py fails
then, so that the pin's next bump says so."""
from __future__ import annotations

import sys
import threading

import torch

METHODS = ('add_param_group', 'zero_grad', 'state_dict', 'load_state_dict')
ATTR = '__dynamo_disable'  # where torch/_compile.py's wrapper caches the compiler's disabled function
_lock = threading.Lock()
_deferred = False


def compiler_loaded() -> bool:
    return 'torch._dynamo' in sys.modules


def _torch_wrapper_code():
    """The code of torch._disable_dynamo's wrapper, by which its wrapped methods are recognised."""
    try:
        return torch._disable_dynamo(lambda: None).__code__
    except (AttributeError, TypeError):
        return None


def _until_loaded(wrapper, fn):
    def call(*args, **kwargs):
        if compiler_loaded():  # torch's own way from here on: its wrapper makes the disabled function
            fn.__dict__.pop(ATTR, None)
            return wrapper(*args, **kwargs)
        return fn(*args, **kwargs)
    return call


def defer() -> bool:
    """Have torch.optim.Optimizer's four wrapped methods run without importing the compiler while
    it is not loaded (once per process). Whether they do: False for a torch whose wrappers this
    module does not know, or when the compiler is loaded already."""
    global _deferred
    with _lock:
        if _deferred:
            return True
        code = _torch_wrapper_code()
        if code is None or compiler_loaded():
            return False
        found = []
        for name in METHODS:
            wrapper = getattr(torch.optim.Optimizer, name, None)
            fn = getattr(wrapper, '__wrapped__', None)
            if fn is None or getattr(wrapper, '__code__', None) is not code:
                return False  # not torch's wrapper as known here: all four stay as they are
            found.append((wrapper, fn))
        for wrapper, fn in found:
            if getattr(fn, ATTR, None) is None:
                setattr(fn, ATTR, _until_loaded(wrapper, fn))
        _deferred = True
        return True
