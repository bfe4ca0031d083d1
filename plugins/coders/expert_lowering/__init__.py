"""The expert lowering: proposer programs (core.program) to fused Triton candidate modules.

``lower_program(program, catalog) -> source`` or :class:`Unsupported` with the reason.
"""

from plugins.coders.expert_lowering.errors import Unsupported
from plugins.coders.expert_lowering.module import lower_program

__all__ = ["Unsupported", "lower_program"]
