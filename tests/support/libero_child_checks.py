"""What the LIBERO tests ask of ``envs.libero.libero_child`` in the family's own environment
(through ``isolated.child.query``): the initial state each reset started from, read off the
simulator, and the images beside LIBERO's raw renders."""

import numpy as np

from envs.libero.libero_child import LiberoSubEnv


def _started_from(sub: LiberoSubEnv) -> int:
    """The official initial state the simulator holds (no settle steps: exactly that state)."""
    state = sub.env.sim.get_state().flatten()
    distances = [float(np.abs(state - official).max()) for official in sub.init_states]
    best = int(np.argmin(distances))
    return best if distances[best] == 0.0 else -1


def reset_sequence_and_images(config):
    """Sub-env ``config["place"]`` of ``config["count"]``: the states of three plain resets, of a
    seeded reset and the one after it, then with ``init_state`` fixed; its images and LIBERO's."""
    sub = LiberoSubEnv({**config, "settle_steps": 0})
    try:
        plain = []
        for _ in range(3):
            sub.reset()
            plain.append(_started_from(sub))
        sub.reset(seed=7)
        seeded = [_started_from(sub)]
        sub.reset()
        seeded.append(_started_from(sub))
        ours = sub.observe()
        images = {"main": ours["main_images"][0], "main_raw": sub.obs["agentview_image"],
                  "wrist": ours["wrist_images"][0], "wrist_raw": sub.obs["robot0_eye_in_hand_image"]}
        # the same state rendered again, then without reflections (env.reflections=false)
        images["main_again"] = sub.env.env._get_observations(force_update=True)["agentview_image"]
        sub._turn_off_reflections()
        images["main_no_reflections"] = sub.env.env._get_observations(force_update=True)["agentview_image"]
        sub.fixed_state = 4
        fixed = []
        for seed in (None, 11):
            sub.reset(seed)
            fixed.append(_started_from(sub))
        return {"plain": plain, "seeded": seeded, "fixed": fixed, **images}
    finally:
        sub.close()


def scene_at_two_mesh_fractions(config):
    """The same episode (initial state 0, ten random actions) with the full scene and with
    ``config["mesh_fraction"]``: triangles drawn, bodies' masses and inertias, the final state, and
    the agent view."""
    seen = {}
    for name, fraction in (("full", 1.0), ("reduced", config["mesh_fraction"])):
        sub = LiberoSubEnv({**config, "settle_steps": 0, "mesh_fraction": fraction})
        try:
            sub.reset(seed=0)
            rng = np.random.default_rng(0)
            for _ in range(10):
                sub.step(rng.uniform(-1, 1, 7))
            model = sub.env.env.sim.model._model
            seen[name] = {"triangles": int(model.mesh_facenum.sum()), "masses": model.body_mass.copy(),
                          "inertias": model.body_inertia.copy(), "state": sub.env.env.sim.get_state().flatten(),
                          "image": sub.observe()["main_images"][0]}
        finally:
            sub.close()
    return seen
