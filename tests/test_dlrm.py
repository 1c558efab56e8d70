"""The master's initial dense parameters, built without an embedding collection."""

from __future__ import annotations

import pytest
import torch

from dlrover.model.dlrm import PSEmbeddingBagCollection, build_dense_dlrm, dense_parameters, initial_dense_vector, table_configs
from dlrover.spec import ModelSpec


def _via_whole_dlrm(model: ModelSpec, seed: int) -> torch.Tensor:
    """How the initial vector was obtained before: a whole DLRM, then its MLP parameters."""
    dlrm = build_dense_dlrm(model, PSEmbeddingBagCollection(table_configs(model)), seed)
    return torch.nn.utils.parameters_to_vector(dense_parameters(dlrm)).detach()


@pytest.mark.parametrize(
    "model",
    [
        ModelSpec(),
        ModelSpec(embedding_dim=8, num_embeddings=1000, dense_arch=[32, 8], over_arch=[64, 16, 1]),
        ModelSpec(arch="dcn", dcn={"num_layers": 3, "low_rank_dim": 16}, embedding_dim=8, num_embeddings=1000, dense_arch=[32, 8], over_arch=[64, 1]),
    ],
    ids=["default", "small", "dcn"],
)
@pytest.mark.parametrize("seed", [0, 7])
def test_initial_dense_vector_is_bit_identical_to_the_whole_dlrm_parameters(model: ModelSpec, seed: int) -> None:
    expected = _via_whole_dlrm(model, seed)
    got = initial_dense_vector(model, seed)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert torch.equal(got, expected)


def test_initial_dense_vector_depends_on_the_seed() -> None:
    assert not torch.equal(initial_dense_vector(ModelSpec(), 0), initial_dense_vector(ModelSpec(), 1))


def test_initial_dense_vector_leaves_the_callers_random_state_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    initial_dense_vector(ModelSpec(), 5)
    assert torch.equal(torch.rand(4), expected)


def test_a_dcn_model_is_torchrecs_dlrm_dcn_with_mlperfs_cross_network_by_default() -> None:
    from torchrec.models.dlrm import DLRM_DCN

    model = ModelSpec(arch="dcn", embedding_dim=8, num_embeddings=100, dense_arch=[16, 8], over_arch=[32, 1])
    assert model.dcn is not None and (model.dcn.num_layers, model.dcn.low_rank_dim) == (3, 512)
    dlrm = build_dense_dlrm(model, PSEmbeddingBagCollection(table_configs(model)), 0)
    assert isinstance(dlrm, DLRM_DCN) and len(dlrm.inter_arch.crossnet.V_kernels) == 3
