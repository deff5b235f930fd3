"""Fit each device's physical constants to its measured runs (prints the fit; --write stores it).

    python benchmarks/fit_profiles.py [--device H100 ...] [--write] [--leave-one-out] [--per-machine]
    python benchmarks/fit_profiles.py --calibration-only     # rewrite only the profiles' calibration: mappings

For every device (advisor/validation/targets.py: A100, H100, Blackwell = B200 and GB200 together,
Blackwell-Ultra = B300 and GB300 together, 910B) the constants (GEMM efficiency scale per dtype and
size shift, attention efficiency per kernel, memory-bound efficiency, launch overhead, link
efficiency, as the target lists them) are fitted by least squares on every usable run of that device
(advisor/validation/fit.py explains the objective). --write puts the fitted curves and constants
into the bundled profiles that share the device (H100's also into dgx-h200: the same GH100 silicon;
Blackwell's into dgx-b200 and gb200-nvl72, each with its own host launch overhead; Blackwell-Ultra's
into dgx-b300 and gb300-nvl72, starting from the bundled Blackwell profiles, so Blackwell is written
first: the default order does). --leave-one-out refits each device once per source without that
source and prints the source's error under the refit: how well the model predicts a source it was
not fitted on (for Blackwell: each system from the other's runs, its own launch overhead then at the
starting value). --per-machine fits each machine a device's runs name (910B: Atlas 800T A2 and Atlas
900 A2 PoDc) on its own runs and prints its error and constants. --calibration-only refits nothing: it
rewrites each profile's calibrated region (advisor.cost.confidence.summarize of the runs the device is fitted
on), for when what the region records changes and the constants do not.
"""

from __future__ import annotations

import argparse
import statistics
import time

from advisor.specs.hardware import PROFILES_DIR, load_hardware
from advisor.validation.fit import PROFILE_SEPARATOR, fit, profile_raw, profile_values
from advisor.cost.confidence import summarize
from advisor.validation.targets import TARGETS, fit_per_machine, fitted_runs, leave_one_source_out, observations
from advisor.validation.write import fitted_text, with_calibration, write_atomic


def _summary(errors: list[float]) -> str:
    return (f"n={len(errors):3d}  MAPE {statistics.mean(abs(e) for e in errors):6.1%}  "
            f"bias {statistics.mean(errors):+6.1%}  max {max(abs(e) for e in errors):6.1%}")


def _as_carried(target, profile: str, result, constants: dict[str, float]) -> list[str]:
    """`constants` (fitted or held) as one profile carries them (profile_values): its own and the shared
    ones, a relative size factor with what it is relative to."""
    values = profile_values(target, profile, result.values, result.fixed)
    out = []
    for name, value in constants.items():
        key, _, owner = name.partition(PROFILE_SEPARATOR)
        if owner not in ("", profile):
            continue
        relative = key == "gemm_size_factor" and profile in target.size_base
        out.append(f"{key} {values[key]:.3g}" + (f" ({value:.3g} x the BF16 peak ratio to H100)" if relative else ""))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--write", action="store_true", help="write the fits into the bundled profiles")
    parser.add_argument("--leave-one-out", action="store_true", help="refit without each source in turn")
    parser.add_argument("--per-machine", action="store_true",
                        help="refit on each machine's runs alone where a device's runs come from several")
    parser.add_argument("--evaluations", type=int, default=60, help="least-squares function evaluations per fit")
    parser.add_argument("--calibration-only", action="store_true",
                        help="rewrite the profiles' calibration: mappings only (no refit)")
    args = parser.parse_args()
    if args.calibration_only:
        for device in args.device:
            target = TARGETS[device]
            for name in target.profiles:
                path = PROFILES_DIR / f"{name}.yaml"
                write_atomic(path, with_calibration(path.read_text(), summarize(fitted_runs(target))))
                print(f"   wrote the calibration of {path}")
        return
    for device in args.device:
        target = TARGETS[device]
        obs = observations(target)
        start = time.perf_counter()
        result = fit(target, obs, args.evaluations)
        print(f"== {device}: {len(obs)} runs, {result.evaluations} evaluations, {time.perf_counter() - start:.0f} s")
        for name, value in result.values.items():
            print(f"   {name:30s} {value:.4g}")
        for source, errors in result.errors.items():
            print(f"   {source:28s} {_summary(errors)}")
        if args.write:
            for name in target.profiles:
                note = (f"{len(obs)} runs ({', '.join(sorted(result.errors))}); "
                        + ", ".join(_as_carried(target, name, result, result.values))
                        + "".join(f"; held: {c}" for c in _as_carried(target, name, result, result.fixed)))
                path = PROFILES_DIR / f"{name}.yaml"
                raw = profile_raw(target, name, load_hardware(name).raw, result.values, result.fixed)
                text = with_calibration(fitted_text(path.read_text(), raw, note), summarize(fitted_runs(target)))
                write_atomic(path, text)
                print(f"   wrote {path}")
        if args.per_machine:
            for machine, (values, errors) in fit_per_machine(target, args.evaluations).items():
                print(f"   only {machine:30s} -> {_summary(errors)}; "
                      + ", ".join(f"{k} {v:.3g}" for k, v in values.items()))
        if args.leave_one_out:
            for source, errors in leave_one_source_out(target, args.evaluations).items():
                print(f"   without {source:28s} -> {_summary(errors)}")


if __name__ == "__main__":
    main()
