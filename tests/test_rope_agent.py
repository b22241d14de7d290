"""The rope agent (agents/rope_transformer.py): rotary positions that make attention read 2D
offsets, where its positions come from, and that it trains through fixed.py."""

import math

import pytest
import torch

import training
from agents import build_agent
from agents.rope_transformer import RopeTransformerAgent, heads_for, rotary_angles, rotate
from engine.config import Config
from engine.errors import ConfigError

# numerically sensitive: `make test` runs these again under ATEN_CPU_CAPABILITY=avx2 and =default


@pytest.mark.numeric
def test_rotary_positions_make_a_query_key_product_depend_on_the_2d_offset_only():
    """q at cell (r1, c1), k at (r2, c2): q'.k' is the same after shifting both cells by (a, b), and
    differs for another offset; prefix tokens are not turned."""
    side, prefix, head_dim = 9, 2, 16
    angles = rotary_angles(side, prefix, head_dim, torch.device("cpu"))
    assert angles.shape == (prefix + side * side, head_dim // 2) and angles[:prefix].eq(0).all()
    q, k = torch.randn(head_dim, dtype=torch.float64), torch.randn(head_dim, dtype=torch.float64)

    def product(cell_q: tuple[int, int], cell_k: tuple[int, int]) -> float:
        tq, tk = (prefix + r * side + c for r, c in (cell_q, cell_k))
        turned_q = rotate(q[None, None, None], angles[tq:tq + 1].double())
        turned_k = rotate(k[None, None, None], angles[tk:tk + 1].double())
        return float((turned_q * turned_k).sum())

    assert product((1, 2), (4, 0)) == pytest.approx(product((4, 6), (7, 4)), abs=1e-5)  # both moved by (3, 4)
    assert product((1, 2), (4, 0)) != pytest.approx(product((1, 2), (0, 4)), abs=1e-3)  # the transposed offset


@pytest.mark.numeric
def test_rotary_turns_rows_with_the_first_quarter_of_pairs_and_columns_with_the_second():
    """Cell (0, 1) (token prefix + 1) turns pair 0 by 0 (row 0) and pair head_dim/4 by 1 radian
    (column 1 times the fastest frequency, 100^0 = 1); cell (1, 0) the other way round."""
    angles = rotary_angles(3, 1, 8, torch.device("cpu"))
    assert angles[1 + 1].tolist()[0] == 0.0 and angles[1 + 1].tolist()[2] == pytest.approx(1.0)
    assert angles[1 + 3].tolist()[0] == pytest.approx(1.0) and angles[1 + 3].tolist()[2] == 0.0
    turned = rotate(torch.tensor([[[[1.0, 0, 0, 0, 0, 0, 0, 0]]]]), angles[4:5])  # pair 0: (x0, x4) by 1 rad
    assert turned[0, 0, 0, 0].item() == pytest.approx(math.cos(1.0)) and turned[0, 0, 0, 4].item() == pytest.approx(
        math.sin(1.0))


def test_the_cells_take_their_positions_from_rotation_alone():
    agent = RopeTransformerAgent(prompt_dim=8, channels=16, layers=1)
    assert agent.cells.position is None
    assert agent(torch.randint(0, 10, (2, 5, 5)), torch.randn(2, 8)).shape == (2, 5, 5, 12)


def test_heads_are_64_channels_wide_from_256_channels_and_the_flags_are_checked_where_it_is_built():
    assert [heads_for(c) for c in (16, 64, 256, 512, 768)] == [4, 4, 4, 8, 12]
    with pytest.raises(ConfigError, match="split into 4 heads of a multiple of 4"):
        build_agent(Config.from_flags(agent="rope", agent_channels=18).agent, prompt_dim=8)


def test_the_rope_agent_trains_end_to_end_and_its_checkpoint_resumes(small_cfg, tmp_path):
    """Two steps through fixed.py's loop, then two more from the checkpoint: the model's flags come
    from it (agent_layers among them)."""
    cfg = small_cfg(agent="rope", agent_channels=16, agent_layers=2, max_batches=2,
                    run_dir=str(tmp_path / "run"))
    assert training.train(cfg, torch.device("cpu"))["steps"] == 2
    resumed = training.train(cfg.replace(epochs=2, resume=str(tmp_path / "run")), torch.device("cpu"))
    assert resumed["steps"] == 4
