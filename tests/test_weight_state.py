"""weight_state.State.offer: the acceptance rule of weight matching refuses candidates outside the group."""

import torch

from factories import make_model, save_model
from symmerge.algebra.elements import identity_element, random_element
from symmerge.match.weight_state import State
from symmerge.store.model import load_model


def _invertible_groups(spec):
    return [n for n, g in spec.groups.items() if g.kind == "invertible"]


def test_a_singular_map_is_refused_and_the_element_kept(tmp_path):
    a = load_model(save_model(make_model("llama", 0), tmp_path / "a"))
    b = load_model(save_model(make_model("llama", 1), tmp_path / "b"))
    spec = b.spec
    st = State(spec, a.params, b.params, identity_element(spec))
    name = _invertible_groups(spec)[0]
    singular = dict(st.g)
    singular[name] = torch.zeros_like(st.g[name])  # no inverse: not a member of the group
    before = dict(st.terms)
    assert st.offer(st.names, singular) is False
    assert st.g[name].equal(identity_element(spec)[name]) and st.terms == before
    # control: an invertible candidate of the same group is judged (taken when it lowers the distance)
    gen = torch.Generator().manual_seed(0)
    other = random_element(spec, gen)
    moved = dict(st.g)
    moved[name] = other[name]
    lower = State(spec, a.params, b.params, moved).similarity() > st.similarity()
    assert st.offer(st.names, moved) is lower
