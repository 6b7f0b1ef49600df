"""Label-smoothed cross-entropy against a float64 reference written from the definition."""

from __future__ import annotations

import math

import pytest
import torch

from xdistill.losses import cross_entropy
from xdistill.losses.smoothing import uniform_nll


def reference(logits_BTV, labels_BT, eps, tau=1.0):
    """Per token i >= 1 with a label: (1 - eps) * -log p(label) + eps * -mean_v log p(v), p from
    output row i - 1 over the finite logits; the mean over those tokens."""
    total, count = 0.0, 0
    B, T, V = logits_BTV.shape
    for b in range(B):
        for i in range(1, T):
            y = int(labels_BT[b, i])
            if y < 0:
                continue
            z = [float(logits_BTV[b, i - 1, v]) / tau for v in range(V)]
            fin = [x for x in z if math.isfinite(x)]
            lse = math.log(sum(math.exp(x) for x in fin))
            nll = lse - z[y]
            uniform = sum(lse - x for x in fin) / len(fin)
            total += (1 - eps) * nll + eps * uniform
            count += 1
    return total / count


@pytest.mark.parametrize("eps,tau", [(0.0, 1.0), (0.1, 1.0), (0.3, 2.0)])
def test_matches_the_definition_and_torch(eps, tau):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 6, 9, dtype=torch.float64, generator=g) * 3
    labels = torch.randint(0, 9, (2, 6), generator=g)
    labels[1, 3] = -100
    got = cross_entropy(z, labels, label_smoothing=eps, temperature=tau, chunk_size=4)
    assert float(got) == pytest.approx(reference(z, labels, eps, tau), rel=1e-12)
    flat = torch.nn.functional.cross_entropy(z[:, :-1].reshape(-1, 9) / tau,
                                             labels[:, 1:].reshape(-1), ignore_index=-100,
                                             label_smoothing=eps)
    assert float(got) == pytest.approx(float(flat), rel=1e-12)


def test_gradcheck_and_a_repeated_backward():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(2, 5, 7, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.randint(0, 7, (2, 5), generator=g)
    labels[0, 4] = -100
    fn = lambda x: cross_entropy(x, labels, label_smoothing=0.2, temperature=1.5, chunk_size=3)
    assert torch.autograd.gradcheck(fn, (z,))
    out = uniform_nll(z, labels, 1.0, 3).sum()
    (g1,) = torch.autograd.grad(out, z, retain_graph=True)
    (g2,) = torch.autograd.grad(out, z)
    assert torch.equal(g1, g2)


def test_masked_vocabulary_smooths_over_the_tokens_the_model_can_emit():
    z = torch.randn(1, 4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    z[..., 4:] = float("-inf")                 # two ids the model can never emit
    labels = torch.tensor([[0, 1, 2, 3]])
    got = cross_entropy(z, labels, label_smoothing=0.25)
    assert math.isfinite(float(got))
    assert float(got) == pytest.approx(reference(z, labels, 0.25), rel=1e-12)
    restricted = cross_entropy(z[..., :4].contiguous(), labels, label_smoothing=0.25)
    assert float(got) == pytest.approx(float(restricted), rel=1e-12)


def test_zero_smoothing_is_plain_cross_entropy_bitwise():
    z = torch.randn(3, 8, 11, generator=torch.Generator().manual_seed(4))
    labels = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(5))
    assert torch.equal(cross_entropy(z, labels), cross_entropy(z, labels, label_smoothing=0.0))


@pytest.mark.parametrize("eps", [-0.1, 1.0, 1.5])
def test_out_of_range_smoothing_is_an_error(eps):
    with pytest.raises(ValueError, match="label_smoothing must lie in"):
        cross_entropy(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long),
                      label_smoothing=eps)
