"""The ``clap`` command line: one small function per subcommand, registered in SUBCOMMANDS.

To add a subcommand, write ``_<name>_args(parser)`` (declare its arguments) and
``_<name>(args) -> int`` (do the work, importing what it needs inside, so ``clap --help``
stays fast), then add one line to SUBCOMMANDS. A :class:`ClapError` becomes
``error: <message>`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from clap.errors import ClapError
from clap.stage import reuse_freed_memory


def _demo_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", type=Path, default=Path("data/raw"), help="folder that receives <batch>/ (default: data/raw)"
    )
    p.add_argument(
        "--batches",
        nargs="+",
        metavar="BATCH",
        help="batches to generate (default: all in params demo.batches)",
    )
    p.add_argument(
        "--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)"
    )


def _demo_data(args: argparse.Namespace) -> int:
    from clap.demo import generate as demo

    p = demo.load_params(args.params)
    for folder in demo.generate(args.out, p, args.batches):
        print(f"wrote {folder}")
    return 0


def _init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("exports", type=Path, help="folder of a company's exports (one batch's files)")
    p.add_argument("--name", required=True, help="profile name: writes <out>/<name>/params.yaml")
    p.add_argument(
        "--out", type=Path, default=Path("profiles"), help="folder of profiles (default: profiles)"
    )
    p.add_argument(
        "--params",
        type=Path,
        default=Path("params.yaml"),
        help="the params the profile extends; its `task` names the asset columns (default: params.yaml)",
    )
    p.add_argument(
        "--ignore", nargs="*", default=[], metavar="GLOB", help="files not to sniff (default: none)"
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing profile params.yaml")


def _init(args: argparse.Namespace) -> int:
    from clap.data import init
    from clap.data.normalize import build_vocab, normalize_params

    vocab = build_vocab(normalize_params(args.params))
    path, result = init.write_profile(
        args.exports, args.name, args.out, vocab.answer, args.ignore, force=args.force,
        base=args.params, vocab=vocab,
    )  # fmt: skip
    print(init.render_report(result))
    guessed, todos = init.counts(result)
    print(
        f"wrote {path}: {len(result.drafts)} sources, {guessed} guesses to check, {todos} TODOs (docs/init.md)"
    )
    return 0


def _keygen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--name",
        required=True,
        help="approver name (token issuer; public key releases/trusted_keys/<name>.pub)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("keys"),
        help="folder of the private key, git-ignored (default: keys/)",
    )


def _keygen(args: argparse.Namespace) -> int:
    from clap.release import keys
    from clap.release.approval import key_sha256, load_private_key
    from clap.release.trust import DEFAULT_ROOT_FILE, ROOT_ENV

    priv, pub = keys.keygen(Path.cwd(), args.name, args.out)
    fingerprint = key_sha256(load_private_key(priv).public_key())
    print(
        f"private key: {priv} (mode 0600; never commit it)\npublic key:  {pub} (commit it)\n"
        f"fingerprint: {fingerprint}\n"
        f"A key approves nothing until it is trusted: pin the first approvers' fingerprints outside the repository "
        f"(${ROOT_ENV} in CI, {DEFAULT_ROOT_FILE} on a workstation); add later ones with "
        f"`clap trust add {args.name} --key <a trusted key>` (signed by release.key_quorum keys in force)"
    )
    return 0


def _signing_keygen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--name",
        default="model-signing",
        help="key file name: <out>/<name>.key and <out>/<name>.pub (default: model-signing)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("keys"),
        help="folder of the key pair, git-ignored (default: keys/)",
    )


def _signing_keygen(args: argparse.Namespace) -> int:
    from clap.release import keys

    priv, pub = keys.signing_keygen(Path.cwd(), args.name, args.out)
    print(
        f"private key: {priv} (EC P-256, mode 0600; never commit it: pass it to `clap release --signing-key`)\n"
        f"public key:  {pub} (each release commits a copy next to its signature)"
    )
    return 0


def _trust_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["add", "revoke"], help="add a key to the keys in force, or revoke one")
    p.add_argument("name", help="the approver (public key releases/trusted_keys/<name>.pub)")
    p.add_argument(
        "--key", type=Path, required=True, help="YOUR private key (a key in force) that signs the change"
    )
    p.add_argument("--reason", default="", help="why (required for revoke; recorded in releases/trust.jsonl)")


def _trust(args: argparse.Namespace) -> int:
    from clap.release import keys, records

    root = Path.cwd()
    event = keys.change_trust(root, args.action, args.name, args.key, records.load_params(root), args.reason)
    signed = ", ".join(event["signers"])
    state = (
        f"pending in releases/trust_pending.json: {event['missing']} more signature(s) of keys in force needed"
        if event["missing"]
        else "in force (releases/trust.jsonl)"
    )
    print(f"{args.action} {args.name} (sha256 {event['key_sha256'][:12]}), signed by {signed}: {state}; "
          f"commit {event['commit'][:12]}")  # fmt: skip
    return 0


def _approve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("batch")
    p.add_argument("--key", type=Path, required=True, help="the approver's private key file")
    p.add_argument(
        "--ttl", type=int, help="token lifetime in seconds (default: params release.approval_ttl_s)"
    )


def _approve(args: argparse.Namespace) -> int:
    import time

    from clap.release import control, records

    root = Path.cwd()
    print(
        control.approve(root, args.batch, args.key, args.ttl, records.load_params(root), now=int(time.time()))
    )
    return 0


def _release_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("batch")
    p.add_argument(
        "--token",
        required=True,
        action="append",
        help="an approval token from `clap approve` ('-' reads one from stdin); repeat it once per approver "
        "(release.approvals_required distinct approvers, capped by the keys in force)",
    )
    p.add_argument(
        "--signing-key",
        type=Path,
        required=True,
        help="EC P-256 private key (PEM) that signs the adapter folder in the OpenSSF model-signing format "
        "(`clap signing-keygen`; never commit it)",
    )
    p.add_argument(
        "--uncertified",
        default="",
        metavar="REASON",
        help="release a batch decided in an uncertified scenario anyway, for this reason (recorded in "
        "releases/history.jsonl); without it such a batch is refused",
    )


def _scenario_now(root: Path) -> dict | None:
    """The certification status of ``root``'s scenario now (None where its params name no record)."""
    from clap import params
    from clap.judge import certification

    path = root / "params.yaml"
    record = params.load(path).get("calibrate", {}).get("record", "")
    return certification.status(path, root / record) if record else None


def _release(args: argparse.Namespace) -> int:
    from clap.release import control, records

    root = Path.cwd()
    tokens = [sys.stdin.read() if t == "-" else t for t in args.token]
    event = control.release(
        root,
        args.batch,
        tokens,
        records.load_params(root),
        signing_key=args.signing_key,
        uncertified=args.uncertified,
        scenario=_scenario_now(root),
    )
    if event["event"] == "hold":
        print(
            f"held: {event['reason']} (release.cost.over_budget is hold); production unchanged; commit {event['release_commit'][:12]}"
        )
        return 3
    sig = event["model_signature"]
    print(
        f"released {args.batch} ({event['pointer']['decision']}); commit {event['release_commit'][:12]}\n"
        f"signed models/adapters/{args.batch}: {sig['signature']} (public key {sig['public_key']}, "
        f"sha256 {sig['public_key_sha256'][:12]})"
    )
    return 0


def _rollback_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch",
        default=None,
        help="act on this batch's gate decision (production_decision must be rollback, about the adapter in "
        "production now); without it: an operator's rollback",
    )


def _rollback(args: argparse.Namespace) -> int:
    from clap.release.rollback import rollback

    event = rollback(Path.cwd(), args.batch)
    why = (
        f" on the gate decision of {event['gate_batch']} ({event['reason']})" if "gate_batch" in event else ""
    )
    if event["to_batch"] is None:
        print(
            f"rolled back {event['from_batch']} -> base model (release.rollback_to_base){why}: nothing is released; "
            f"`clap serve` follows serve.unreleased; commit {event['release_commit'][:12]}"
        )
        return 0
    print(
        f"rolled back {event['from_batch']} -> {event['to_batch']}{why} (adapter {event['adapter_sha256'][:12]} restored by "
        f"{event['adapter_restored_by']}); commit {event['release_commit'][:12]}"
    )
    return 0


def _registry_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", type=Path, default=None, help="repository root (default: the current folder)")


def _registry_check(args: argparse.Namespace) -> int:
    from clap.release.registry import check_registry

    check_registry(args.root if args.root is not None else Path.cwd(), emit=print)
    return 0


def _handoff_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("batch")
    p.add_argument("--out", type=Path, help="output folder (default: releases/handoff/<batch>)")


def _handoff(args: argparse.Namespace) -> int:
    from clap.release import control, records

    root = Path.cwd()
    problems = control.handoff(root, args.batch, args.out, records.load_params(root))
    for problem in problems:
        print(f"invalid: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="bind address (default: params serve.host)")
    p.add_argument("--port", type=int, help="port (default: params serve.port)")


def _serve(args: argparse.Namespace) -> int:
    from clap.chain import serve

    serve.serve(Path.cwd(), args.host, args.port)
    return 0


def _canary_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--apply",
        action="store_true",
        help="act on the verdict: rollback through `clap rollback`'s path, promote by committing the analysis "
        "(`clap serve` does it itself after every serve.canary.watch_every-th request)",
    )


def _canary(args: argparse.Namespace) -> int:
    from clap.release import canary, canary_action

    rec = canary_action.run_canary(Path.cwd(), args.apply)
    json_path, md_path = canary.report_paths(rec["batch"])
    print(canary.render(rec), end="")
    print(f"written: {json_path}, {md_path}")
    applied = rec["applied"]
    if isinstance(applied, dict):
        print(
            f"rolled back {applied['from_batch']} -> {applied['to_batch'] or 'base'}; commit {applied['release_commit'][:12]}"
        )
    elif applied:
        print(f"promoted: the canary serves all traffic after `clap serve` restarts; commit {applied[:12]}")
    return 1 if rec["decision"] == "rollback" and not applied else 0


def _controls_args(p: argparse.ArgumentParser, name: str) -> None:
    """The options `clap calibrate` and `clap certify` share (outputs under reports/<name>, metrics/<name>.json)."""
    p.add_argument(
        "--base", type=Path, default=Path("models/base"), help="base model folder (default: models/base)"
    )
    p.add_argument(
        "--report-dir",
        type=Path,
        default=Path("reports") / name,
        help=f"table, runs and curves (default: reports/{name})",
    )
    p.add_argument(
        "--metrics",
        type=Path,
        default=Path("metrics") / f"{name}.json",
        help=f"flat metrics (default: metrics/{name}.json)",
    )
    p.add_argument(
        "--params", type=Path, default=Path("params.yaml"), help="params file (default: params.yaml)"
    )


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "admitted",
        type=Path,
        nargs="+",
        help="admitted batch folders, e.g. data/admitted/2026-01 (read only); faults run on the first",
    )
    _controls_args(p, "calibration")


def _run_controls(args: argparse.Namespace, dirs: list[Path], title: str):
    import os
    import tempfile

    os.environ.setdefault(
        "HF_HUB_OFFLINE", "1"
    )  # before transformers is imported: the hub is never contacted
    from clap.judge import calibrate as cal

    cp, loop = cal.load_params(args.params)
    with tempfile.TemporaryDirectory(prefix="clap-calibrate-") as work:
        result = cal.calibrate(
            dirs, args.base, work, cp, loop, on_row=lambda r: print(cal.progress_line(r), flush=True)
        )
    cal.write_outputs(result, args.report_dir, args.metrics, title)
    print(f"wrote {args.report_dir / 'calibration.md'} and {args.metrics}")
    return cp, result


def _uncertified(result) -> int:
    from clap.judge import certification

    verdict, failed = certification.verdict(result.rows)
    if failed:
        print(f"error: {verdict}: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    _, result = _run_controls(args, args.admitted, ", ".join(d.name for d in args.admitted))
    return _uncertified(result)


def _certify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        type=Path,
        default=Path("data/admitted"),
        help="folder of the admitted batches named by params calibrate.batches (default: data/admitted); "
        "a batch not there is assetized, normalized and admitted from data/raw/<batch> by the stage scripts "
        "into a scratch folder",
    )
    p.add_argument(
        "--rebind",
        action="store_true",
        help="run nothing: bind the committed record to the params keys this clap binds and it does not yet, "
        "when their values at the record's commit (git) are today's; else fail (re-certify)",
    )
    _controls_args(p, "certification")


def _rebind(params_path: Path, record_path: Path) -> int:
    import os
    import time

    from clap import io
    from clap.judge import certification
    from clap.vcs import git

    rec = io.read_json(record_path)

    def read_then(path: Path) -> str:  # a params file as the record's commit had it (path relative to cwd)
        rel = os.path.relpath(path)
        return git(".", "show", f"{rec['commit']}:{rel if rel.startswith('..') else './' + rel}")

    new = certification.rebind(record_path, params_path, read_then, time.strftime("%Y-%m-%d", time.gmtime()))
    if new == rec:
        print(f"{record_path} already binds every key: nothing to do")
        return 0
    io.write_json(record_path, new)
    print(f"bound {record_path} to {new['rebound']['keys']}: unchanged since commit {rec['commit'][:12]}")
    return 0


def _admitted(data: Path, batch: str, prep: Path) -> Path:
    """``data/<batch>`` if admitted there, else the batch run from ``data/raw/<batch>`` through the
    assetize, normalize and admit stage scripts (as dvc.yaml runs them) into ``prep``."""
    import subprocess

    if (data / batch / "admission.json").exists():
        return data / batch
    stages = Path(__file__).resolve().parents[1] / "stages"
    steps = [("assetize", Path("data/raw") / batch, prep / "assets" / batch),
             ("normalize", prep / "assets" / batch, prep / "normalized" / batch),
             ("admit", prep / "normalized" / batch, prep / "admitted" / batch)]  # fmt: skip
    for name, src, out in steps:
        cmd = [
            sys.executable,
            str(stages / f"{name}.py"),
            str(src),
            str(out),
            str(prep / f"{name}-{batch}.json"),
        ]
        if subprocess.run(cmd).returncode:
            raise ClapError(
                f"{name} of batch {batch} failed (its output above)", file=src, rule="certify_data"
            )
    return prep / "admitted" / batch


def _certify(args: argparse.Namespace) -> int:
    import tempfile
    import time

    from clap import io
    from clap.determinism import hardware_class
    from clap.judge import calibrate as cal
    from clap.judge import certification
    from clap.model.base import default_device
    from clap.params import bad_param
    from clap.vcs import commit_or_unknown

    cp, _ = cal.load_params(args.params)
    if args.rebind and cp.record:
        return _rebind(args.params, Path(cp.record))
    if not cp.batches or not cp.record:
        raise bad_param(
            "calibrate.record" if cp.batches else "calibrate.batches",
            "certification needs params calibrate.batches (the clean batches) and calibrate.record",
            args.params,
        )
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="clap-certify-") as prep:
        dirs = [_admitted(args.data, b, Path(prep)) for b in cp.batches]
        _, result = _run_controls(args, dirs, f"certification of {', '.join(cp.batches)}")
        record = certification.build_record(
            result.rows,
            {**result.summary, "wall_seconds": round(time.time() - t0, 1)},
            params_path=args.params,
            base_dir=args.base,
            admitted={d.name: d for d in dirs},
            commit=commit_or_unknown(),
            machine=hardware_class(default_device()),
            date=time.strftime("%Y-%m-%d", time.gmtime()),
        )
    io.write_json(Path(cp.record), record)
    print(f"wrote {cp.record}: {record['verdict']}")
    return _uncertified(result)


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="a commit (every batch it ran) or a batch name (that batch at HEAD)")
    p.add_argument("--keep", action="store_true", help="keep the temporary checkout for inspection")


def _verify(args: argparse.Namespace) -> int:
    from clap import params
    from clap.release.compare import VerifyParams
    from clap.release.verify import render_table, verify

    result = verify(
        Path.cwd(),
        args.target,
        params.section("verify", VerifyParams),
        keep=args.keep,
        log=lambda line: print(line, file=sys.stderr),
    )
    print(render_table(result))
    return 1 if result.failures else 0


def _pr_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", default="HEAD", help="the committed revision to compare with (default: HEAD)")
    p.add_argument("--markdown", type=Path, help="also write the verdict and decision diff here (PR comment)")


def _pr_check(args: argparse.Namespace) -> int:
    from clap import params
    from clap.release.compare import VerifyParams
    from clap.release.prcheck import pr_check, render, write_markdown

    result = pr_check(Path.cwd(), params.section("verify", VerifyParams), args.base)
    print(render(result))
    if args.markdown is not None:
        write_markdown(result, args.markdown)
    return 1 if result.failures else 0


# name -> (help, declare arguments, run)
SUBCOMMANDS: dict[
    str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
] = {
    "demo-data": (
        "generate the deterministic demo raw batches (data/raw/<batch>/)",
        _demo_data_args,
        _demo_data,
    ),
    "init": (
        "draft a profile's params.yaml (assetize.sources) from a folder of your own exports",
        _init_args,
        _init,
    ),
    "keygen": ("create an approver's Ed25519 key pair", _keygen_args, _keygen),
    "signing-keygen": (
        "create the EC P-256 key pair that signs released adapters (OpenSSF model-signing format)",
        _signing_keygen_args,
        _signing_keygen,
    ),
    "trust": (
        "sign a key change (add an approver's key, or revoke one); it takes effect at release.key_quorum signatures",
        _trust_args,
        _trust,
    ),
    "approve": ("sign a single-use approval of a batch's gate decision", _approve_args, _approve),
    "release": ("verify an approval and put the batch in production", _release_args, _release),
    "rollback": (
        "return production to the previous release (or to the base model, by release.rollback_to_base)",
        _rollback_args,
        _rollback,
    ),
    "registry-check": (
        "replay every commit that changed releases/: each release signed by a trusted, unrevoked key, "
        "used once, hashes bound; each rollback back to the previous release",
        _registry_check_args,
        _registry_check,
    ),
    "handoff": ("write and validate a batch's model card, manifest and cost report", _handoff_args, _handoff),
    "serve": (
        "serve the production adapter's application chain over HTTP (POST /answer, GET /health)",
        _serve_args,
        _serve,
    ),
    "canary": (
        "test the canary in production on `clap serve`'s request log: rollback when it fails more often, "
        "promote when it is not worse by serve.canary.max_ratio (anytime-valid)",
        _canary_args,
        _canary,
    ),
    "certify": (
        "run the profile's controls and write its certification record (clean batches must learn, faults must be caught)",
        _certify_args,
        _certify,
    ),
    "calibrate": (
        "run train -> eval -> gate on injected faults and clean seeds; fail if a fault is released or a clean run does not learn",
        _calibrate_args,
        _calibrate,
    ),
    "verify": (
        "re-run a committed batch from a clean checkout and compare decisions, metrics and hashes",
        _verify_args,
        _verify,
    ),
    "pr-check": (
        "after `dvc repro`: fail when a committed decision, hash or value in metrics/, records/ or "
        "dvc.lock differs from the working tree; timings, provenance and environment only inform",
        _pr_check_args,
        _pr_check,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="clap", description="Governed post-training of domain agents.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, declare, run) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        declare(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``clap`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    reuse_freed_memory()
    try:
        return args.run(args)
    except ClapError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
