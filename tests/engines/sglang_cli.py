"""SGLang's own command lines, run in this process up to where they would load a model.

    python tests/engines/sglang_cli.py OUT.json '[["sglang", ["generate", ...]], ...]'

Each ``[entry, argv]`` runs with ``sys.argv = [entry, *argv]`` through SGLang's code:

* ``"sglang"``: the ``sglang`` console script (``sglang.cli.main:main``);
* ``"runtime"``: ``python -m sglang.multimodal_gen.runtime.entrypoints.cli.main``.

Everything up to the model load is SGLang's: argument parsing, the diffusion-model detection, the
plugin loading where that command does it, ``ServerArgs`` and its checks. Two calls are replaced
(they are where the arguments are final and the model would be loaded): generate's
``DiffGenerator.from_pretrained`` and serve's ``dispatch_launch`` record the ``ServerArgs`` they
got and stop. Importing the modules that hold them loads no plugin: SGLang loads plugins only by
explicit calls (``load_plugins``, ``apply_plugin_hooks``).

OUT.json gets one record per entry, in order, in this one process (plugin loading is once per
process: what an earlier entry loaded stays loaded): ``outcome`` ``"reached"`` (with the
arguments seen) or ``"refused"`` (with the error), and the state of SGLang's plugin registration
before the entry ran (``plugins_before``) and when it ended (``plugins``).
"""

from __future__ import annotations

import json
import os
import sys


class Reached(Exception):
    """The command got as far as loading the model."""


def main() -> None:
    out_path, calls = sys.argv[1], json.loads(sys.argv[2])
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("SGLANG_DIFFUSION_PLATFORM_OVERRIDE", "cpu")  # no CUDA guess
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model directory: nothing to fetch
    from engines import stubs

    stubs.install("torchvision")
    from sglang.cli.main import main as sglang_main
    from sglang.multimodal_gen.runtime import launch_server
    from sglang.multimodal_gen.runtime.entrypoints import diffusion_generator
    from sglang.multimodal_gen.runtime.entrypoints.cli.main import main as runtime_main
    from sglang.multimodal_gen.runtime.platforms import plugins
    from sglang.multimodal_gen.runtime.server_args import server_args as server_args_module

    def state() -> str:
        return plugins._plugin_registration.state.value

    def seen(server_args) -> dict:
        return dict(attention_backend=server_args.attention_backend,
                    ring_degree=server_args.ring_degree,
                    ulysses_degree=server_args.ulysses_degree,
                    ring_capable=list(server_args_module.RING_CAPABLE_ATTENTION_BACKENDS))

    def stop_generate(*args, server_args=None, **kwargs):
        raise Reached(seen(server_args))

    def stop_serve(server_args, *args, **kwargs):
        raise Reached(seen(server_args))

    diffusion_generator.DiffGenerator.from_pretrained = staticmethod(stop_generate)
    serve_module = "sglang.multimodal_gen.runtime.entrypoints.cli.serve"
    assert serve_module not in sys.modules, f"{serve_module} imported dispatch_launch already"
    launch_server.dispatch_launch = stop_serve  # imported by name when serve's module loads
    entries = {"sglang": sglang_main, "runtime": runtime_main}
    results = []
    for entry, argv in calls:
        before = state()
        sys.argv = [entry, *argv]
        try:
            entries[entry]()
            record = {"outcome": "returned"}
        except Reached as reached:
            record = {"outcome": "reached", **reached.args[0]}
        except Exception as e:  # the refusal is the result
            record = {"outcome": "refused", "error": f"{type(e).__name__}: {e}"}
        results.append({"entry": entry, "argv": argv, "plugins_before": before,
                        "plugins": state(), **record})
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
