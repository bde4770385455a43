"""Ascending code points as the {first, last} ranges that the tables of src/tokenizer/ are written in."""


def ranges_of(code_points):
    """[[first, last], ...] of the runs of consecutive code points in the ascending `code_points`."""
    ranges = []
    for cp in code_points:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return ranges


def cpp_ranges(code_points):
    """The ranges as C++ initializers: {0x0300, 0x036F}, {0x0483, 0x0487}, ..."""
    return ", ".join(f"{{0x{a:04X}, 0x{b:04X}}}" for a, b in ranges_of(code_points))
