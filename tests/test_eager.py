"""The eager-only shortcuts apply only in plain eager CPU execution (functional_bfo._eager)."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import functional_bfo as fb
from functional_bfo._eager import plain_cpu


def test_plain_eager_cpu_tensors_qualify():
    assert plain_cpu(torch.ones(2), torch.tensor(3))


def test_vmap_fake_tensors_and_compile_do_not_qualify():
    seen = []
    torch.func.vmap(lambda t: (seen.append(plain_cpu(t)), t)[1])(torch.ones(3))
    assert seen == [False]
    with FakeTensorMode():
        assert not plain_cpu(torch.empty(2))
    compiled = torch.compile(lambda t: t + 1 if plain_cpu(t) else t - 1, fullgraph=True)
    assert torch.equal(compiled(torch.zeros(2)), -torch.ones(2))


def test_a_traced_block_function_stays_an_op_instead_of_baked_words():
    counters = torch.arange(4)
    graph = make_fx(lambda k, c: fb.random.threefry2x32(k, c, c))(fb.random.key(0), counters)
    assert "threefry2x32" in str(graph.graph)


def test_a_traced_row_draw_stays_an_op_that_follows_its_counter():
    draw = lambda k, c: fb.random.normal_rows(k, c, 3, 5)  # noqa: E731
    key = fb.random.key(0)
    graph = make_fx(draw)(key, torch.tensor(1))
    assert "erfinv_rows" in str(graph.graph)
    assert torch.equal(graph(key, torch.tensor(2)), draw(key, torch.tensor(2)))
