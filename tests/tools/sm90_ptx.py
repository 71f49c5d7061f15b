"""Build (``write``) or compare (``check``) the PTX fp8dit ships for the warp-specialized kernel
(:mod:`fp8dit.prebuilt`), with triton 3.6, on a machine with or without a GPU.

    python tests/tools/sm90_ptx.py write   # after a change to kernels/attention_sm90_ws.py
    python tests/tools/sm90_ptx.py check   # exit 1 when the shipped files are not this build
    python tests/tools/sm90_ptx.py release D128-dense OUTDIR   # this release's build of it

Each shipped configuration (``tuning.gluon_tiles`` and ``gluon_causal_tiles``, by padded head
dim) is compiled for sm_90 as ``fp8dit.prebuilt.ast_source`` specializes it; its PTX goes to
``src/fp8dit/ptx/<config>.ptx.xz``, and ``manifest.json`` records the kernel source's hash, the
compile-time arguments and what the launch needs (shared memory, warps), which
``tests/test_prebuilt.py`` checks each release's own build of the kernel against.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import sys

import triton
from triton.backends.compiler import GPUTarget

from fp8dit import prebuilt, tuning

BUILT_WITH = "3.6"
METADATA = ("shared", "num_warps", "num_ctas", "global_scratch_size", "profile_scratch_size",
            "tmem_size")


def configs() -> list[tuple[int, bool]]:
    tuned = tuning.current()
    return ([(dp, False) for dp in sorted(tuned.gluon_tiles)]
            + [(dp, True) for dp in sorted(tuned.gluon_causal_tiles)])


def portable(ptx: str) -> str:
    """``ptx`` without what names the machine it was built on: the DWARF sections (they hold
    the build's folders; ptxas builds the same sm_90 code without them, and keeps the line
    table of the ``.loc`` directives) and the folders of the ``.file`` directives, package
    relative."""
    head, sep, _ = ptx.partition("\t.section\t.debug")
    if sep:
        head = head.rstrip() + "\n"

    def relative(m):
        path = m.group(2)
        for root in ("fp8dit", "triton"):
            marker = f"/{root}/"
            if marker in path:
                path = root + "/" + path.rsplit(marker, 1)[1]
                break
        return f'{m.group(1)}"{path}"'

    return re.sub(r'(\t\.file\t\d+ )"([^"]*)"', relative, head)


def build(dp: int, causal: bool) -> tuple[str, dict]:
    """(PTX text, manifest entry) of one configuration, with the installed Triton."""
    ck = triton.compile(prebuilt.ast_source(dp, causal), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4})
    md = ck.metadata._asdict()
    entry = {"constexprs": prebuilt.config_constexprs(dp, causal),
             "metadata": {k: md.get(k) for k in METADATA}}
    return portable(ck.asm["ptx"]), entry


def main(mode: str) -> int:
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"
    release = ".".join(triton.__version__.split(".")[:2])
    if release != BUILT_WITH:
        print(f"the shipped PTX is triton {BUILT_WITH}'s; this is {triton.__version__}",
              file=sys.stderr)
        return 2
    old = prebuilt.manifest()
    new = {"triton": triton.__version__, "source_sha256": prebuilt.source_hash(), "configs": {}}
    status = 0
    for dp, causal in configs():
        name = prebuilt.config_name(dp, causal)
        ptx, entry = build(dp, causal)
        data = ptx.encode()
        entry.update(file=f"{name}.ptx.xz", sha256=hashlib.sha256(data).hexdigest())
        new["configs"][name] = entry
        if mode == "write":
            (prebuilt.PTX_DIR / entry["file"]).write_bytes(
                lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
        elif old.get("configs", {}).get(name) != entry:
            print(f"{name}: the shipped PTX is not this build "
                  f"({old.get('configs', {}).get(name)} against {entry})", file=sys.stderr)
            status = 1
        print(json.dumps({"config": name, **entry}), flush=True)
    if mode == "write":
        prebuilt.PTX_DIR.mkdir(exist_ok=True)
        (prebuilt.PTX_DIR / "manifest.json").write_text(json.dumps(new, indent=1) + "\n")
    elif old.get("source_sha256") != new["source_sha256"]:
        print("the shipped PTX was built from another version of the kernel's source",
              file=sys.stderr)
        status = 1
    return status


def release_build(name: str, outdir: str) -> int:
    """The installed release's build of configuration ``name`` from the shipped PTX, as
    ``attend`` launches it (``ir_override``, :func:`fp8dit.prebuilt.assembler`): its PTX, cubin
    and launch metadata into ``outdir``."""
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"
    (dp, causal), = [(dp, c) for dp, c in configs() if prebuilt.config_name(dp, c) == name]
    with prebuilt.assembler("sm90_ptx.py", dp, causal):
        ck = triton.compile(prebuilt.ast_source(dp, causal), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 4,
                                     "ir_override": prebuilt.ptx_path(dp, causal)})
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, f"{name}.ptx"), "w") as f:
        f.write(ck.asm["ptx"])
    with open(os.path.join(outdir, f"{name}.cubin"), "wb") as f:
        f.write(ck.asm["cubin"])
    md = ck.metadata._asdict()
    with open(os.path.join(outdir, f"{name}.json"), "w") as f:
        json.dump({k: md.get(k) for k in METADATA}, f)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "release":
        sys.exit(release_build(sys.argv[2], sys.argv[3]))
    if len(sys.argv) != 2 or sys.argv[1] not in ("write", "check"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
