"""Geometries (docs/model.md, "Geometries: normalization schemes"): how the attention velocity moves the
tokens, one declaration each.

Write a token as ``x_k = r_k theta_k`` (``theta_k`` on the sphere). Attention reads the directions and
gives ``u_k = sum_h f^h_k`` (``(1/n) sum_h`` for usa); every scheme of Karagodin, Ge, Polyanskiy and
Rigollet (2025) is the sphere flow ``dtheta_k/dt = s_k P_{theta_k}(u_k)`` with a per-token speed
``s_k`` (docs/model.md, result 12). A declaration says everything the rest of attnflow needs:

- the compiled engines: the ``Motion`` rule that turns ``u`` into ``dx/dt`` (one kernel per engine),
  whether the state carries radii (``radii``: ``x_k = r_k theta_k``, attention and every observable
  read ``theta_k``) and whether it stays on the unit sphere (``on_sphere``: retracted after each step,
  its drift checked);
- the cell: which fields it reads (``uses``: nGPT's step size);
- the closed forms (``attnflow.theory``) and the docs: the speed ``s_k`` as a function of ``r_k`` and
  ``||u_k||`` (``speed``; then ``dr_k/dt = s_k r_k <theta_k, u_k>`` where the state carries radii).

Each rule is an enum member every engine implements (``attnflow.contract``): an engine refuses a
geometry whose rule has no kernel there, by name, at import and at every ``solve`` (no default
branch). Adding a geometry is one entry here, plus for a new rule its member and its kernel in each
engine (``engine.field.motion``, ``jaxengine.field.MOTIONS``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from enum import IntEnum

from .registry import Registry


class Motion(IntEnum):
    """How the field turns the attention velocity ``u_k`` (read at the directions) into ``dx_k/dt``."""

    TANGENT = 0  # P_{x_k}(u_k): the projection onto the tangent space
    FREE = 1  # u_k
    UNIT = 2  # u_k / ||u_k||
    UNIT_TANGENT = 3  # alpha P_{x_k}(u_k) / ||u_k||, alpha = the cell's ngpt_alpha


@dataclasses.dataclass(frozen=True)
class Geometry:
    name: str
    motion: Motion  # the field's rule (a rule without its kernel in an engine is refused there)
    # The state is x_k = r_k theta_k with radii r_k (1 at the start): attention reads the directions
    # theta_k = x_k / ||x_k||, and so does every observable (the ``radius`` group records r_k).
    radii: bool
    on_sphere: bool  # the state stays on the unit sphere: retracted after every step, its drift checked
    speed_text: str  # s_k in dtheta_k/dt = s_k P(u_k), in words ("" where the flow is not a sphere flow)
    description: str
    # s_k from (r_k, ||u_k||, ngpt_alpha), numpy arrays; None where the flow is not a sphere flow (flat).
    # With radii it is 1/r_k times a function of ||u_k|| (the update does not grow with the radius; the
    # closed-form times rely on it: theory.equiangular_scheme_time).
    speed: Callable | None = None
    uses: tuple[str, ...] = ()  # cell fields it reads (reset to their defaults elsewhere)

    @property
    def unit_rows(self) -> bool:
        """Whether the observables read unit rows (the state itself on the sphere, or its directions)."""
        return self.on_sphere or self.radii


GEOMETRIES: Registry[Geometry] = Registry("geometry", [
    Geometry("sphere", Motion.TANGENT, radii=False, on_sphere=True, speed_text="1",
             description="Post-LN: tokens on the unit sphere, dx_i/dt = P_{x_i}(u_i)",
             speed=lambda r, u, alpha: 1.0 + 0.0 * (r + u)),
    Geometry("flat", Motion.FREE, radii=False, on_sphere=False, speed_text="",
             description="flat space: dx_i/dt = u_i, attention on x_i itself (only to contrast with the "
                         "sphere)"),
    Geometry("pre_ln", Motion.FREE, radii=True, on_sphere=False, speed_text="1/r_k",
             description="Pre-LN: dx_k/dt = u_k with attention on the directions theta_k = x_k/||x_k||, "
                         "so dr_k/dt = <theta_k, u_k>, dtheta_k/dt = P(u_k)/r_k (radii start at 1)",
             speed=lambda r, u, alpha: 1.0 / r + 0.0 * u),
    Geometry("peri_ln", Motion.UNIT, radii=True, on_sphere=False, speed_text="1/(r_k ||u_k||)",
             description="Peri-LN: dx_k/dt = u_k/||u_k|| with attention on the directions, so "
                         "dtheta_k/dt = P(u_k)/(r_k ||u_k||) (radii start at 1)",
             speed=lambda r, u, alpha: 1.0 / (r * u)),
    Geometry("ngpt", Motion.UNIT_TANGENT, radii=False, on_sphere=True, speed_text="ngpt_alpha/||u_k||",
             description="nGPT: tokens on the unit sphere, dx_i/dt = ngpt_alpha P_{x_i}(u_i)/||u_i||",
             speed=lambda r, u, alpha: alpha / u + 0.0 * r, uses=("ngpt_alpha",)),
])
