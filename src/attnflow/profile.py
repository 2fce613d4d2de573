"""What ``attnflow plan`` reads from a Snakemake profile: cores, cluster jobs, the simulate rule's threads
and the GPUs its ``resources`` declare."""

from __future__ import annotations

from pathlib import Path


def profile_settings(profile: str | Path | None) -> dict:
    """``cores``, ``jobs``, the simulate rule's threads and ``gpus`` (its ``resources: [gpu=N]``) from a
    Snakemake profile directory (or its config.yaml); empty without one."""
    import yaml

    if profile is None:
        return {}
    path = Path(profile)
    path = path / "config.yaml" if path.is_dir() else path
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise FileNotFoundError(f"--profile {profile}: cannot read {path} ({err.strerror})") from None
    out = {}
    gpus = _gpu_resource(config.get("resources"))
    if gpus is not None:
        out["gpus"] = gpus
    threads = (config.get("set-threads") or {}).get("simulate")
    if threads:
        out["threads"] = int(threads)
    cores = config.get("cores")
    if isinstance(cores, int):
        out["cores"] = cores
    if config.get("executor") not in (None, "local") and config.get("jobs"):
        out["cluster_jobs"] = int(config["jobs"])  # a cluster: each job on cores of its own
    return out


def _gpu_resource(resources_setting) -> int | None:
    """``gpu=N`` of a profile's ``resources`` (a list of ``name=value`` or a mapping), or None."""
    if isinstance(resources_setting, dict):
        value = resources_setting.get("gpu")
    else:
        found = [str(r).split("=", 1)[1] for r in resources_setting or () if str(r).startswith("gpu=")]
        value = found[-1] if found else None
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


__all__ = ["profile_settings"]
