"""The package's import structure (issue 31): imports run one way down the layers, and the lab's own
modules imported inside functions are few, each with its reason."""
from __future__ import annotations

import ast
from pathlib import Path

SLM_LAB = Path(__file__).resolve().parent.parent / 'slm_lab'
# lower first: a module may import its own layer's and lower layers' modules at the top
LAYERS = {'lib': 0, 'resources': 0, 'env': 1, 'agent': 2, 'spec': 3, 'persistence': 4, 'experiment': 5}
TOP = 6  # lab, runs, cli, api, branch, benchmark_mode, options, entry and the package itself
MAX_FUNCTION_IMPORTS = 30


def layer(module: str) -> int:
    parts = module.split('.')
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def own_imports(tree: ast.AST, package: str = 'slm_lab'):
    """(node, imported module names, inside a function) for each import of the lab's own modules;
    a relative import is read from `package`, the package of the module it is in."""
    inside = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = '.'.join(package.split('.')[:len(package.split('.')) - node.level + 1])
            module = f'{base}.{node.module}' if node.module else base
            names = [module if node.module else f'{base}.{a.name}' for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith('slm_lab'):
            names = [f'slm_lab.{a.name}' for a in node.names] if node.module == 'slm_lab' else [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith('slm_lab')]
        else:
            continue
        if names:
            yield node, names, id(node) in inside


def modules():
    """(path under slm_lab/, dotted module name, its package, its lines, its syntax tree) of each module."""
    for path in sorted(SLM_LAB.rglob('*.py')):
        rel = path.relative_to(SLM_LAB).as_posix()
        dotted = rel[:-3].replace('/', '.').removesuffix('.__init__')
        module = 'slm_lab' if rel == '__init__.py' else f'slm_lab.{dotted}'
        package = module if path.name == '__init__.py' else module.rsplit('.', 1)[0]
        yield rel, module, package, path.read_text().splitlines(), ast.parse(path.read_text())


def test_imports_run_down_the_layers():
    upward = []
    for rel, module, package, _, tree in modules():
        for node, names, _ in own_imports(tree, package):
            for name in names:
                if layer(name) > layer(module):
                    upward.append(f'{rel}:{node.lineno} imports {name}')
    assert not upward, upward


def test_the_lab_imports_its_own_modules_inside_functions_rarely_and_says_why():
    found, unexplained = [], []
    for rel, _, package, lines, tree in modules():
        for node, _, in_function in own_imports(tree, package):
            if not in_function:
                continue
            found.append(f'{rel}:{node.lineno}')
            line = lines[node.end_lineno - 1]
            reason = line.split('# noqa: PLC0415', 1)[1].strip(' ()') if '# noqa: PLC0415' in line else ''
            if len(reason) < 8:
                unexplained.append(f'{rel}:{node.lineno}')
    assert len(found) <= MAX_FUNCTION_IMPORTS, found
    assert not unexplained, f'give each a reason after "# noqa: PLC0415": {unexplained}'


def test_the_search_package_imports_none_of_its_modules():
    # a search's processes (python -m slm_lab.experiment.search.trial, .reaper, .ray_head) load the
    # package first: it imports nothing, so each loads only what its own module imports
    tree = ast.parse((SLM_LAB / 'experiment' / 'search' / '__init__.py').read_text())
    assert not [node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def test_modules_import_each_others_public_names_only():
    # a name with a leading underscore is its module's own: a second module that needs it makes it public
    private = []
    for rel, _, package, _, tree in modules():
        for node, _, _ in own_imports(tree, package):
            if isinstance(node, ast.ImportFrom):
                private += [f'{rel}:{node.lineno} {a.name}' for a in node.names
                            if a.name.startswith('_') and not a.name.startswith('__')]
    assert not private, private
