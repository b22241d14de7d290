"""bench/grid_text_tokens.py: the token counts of each grid text format."""

import numpy as np

from bench.grid_text_tokens import no_newlines, run_lengths, task_tokens
from data.arc import ArcPair, ArcTask
from prompt.qwen_encoder import tiny_tokenizer


def test_each_format_counts_a_token_a_digit_newline_or_word():
    grid = np.array([[1, 1, 1, 2], [0, 0, 0, 0], [3, 4, 3, 4]])  # 3 x 4
    assert no_newlines(grid) == 1 + 1 + 1 + 1 + 12  # marker, "3", "x", "4", the cells
    assert run_lengths(grid) == 1 + (2 + 1 + 1) + (2 + 1) + (4 + 1)  # "13 2", "04", "3434", each with its newline
    wide = np.zeros((1, 12), dtype=np.int64)
    assert run_lengths(wide) == 1 + 3 + 1  # "0" "1" "2": a run of 12 is three tokens
    task = ArcTask("t", (ArcPair(grid, wide),), ())
    # the current format, tokenized: each grid's rows with their newlines and its marker line
    assert task_tokens(task, tiny_tokenizer())["current (digit rows)"] == (3 * 5 + 2) + (1 * 13 + 2)
