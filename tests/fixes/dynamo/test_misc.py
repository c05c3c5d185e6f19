# Owner(s): ["module: dynamo"]
import torch_overlay  # noqa: F401  # torch_overlay: plumbing

import torch
import torch._dynamo.test_case
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def _export_only_branch(x):
    if torch.compiler.is_exporting():
        return x + 100
    return x + 1


class _ExportOnlyBranch(torch.nn.Module):
    def forward(self, x):
        return _export_only_branch(x)


class TestDynamoIsExportingFolded(torch._dynamo.test_case.TestCase):
    """torch.compiler.is_exporting() is False while torch.compile traces."""

    @parametrize("fullgraph", [True, False])
    def test_is_exporting_false_under_compile(self, fullgraph):
        x = torch.zeros(3)
        compiled = torch.compile(_export_only_branch, backend="eager", fullgraph=fullgraph)
        self.assertEqual(compiled(x), x + 1)

    def test_is_exporting_false_under_compile_after_export(self):
        # export sets the flag only for its own trace
        x = torch.zeros(3)
        ep = torch.export.export(_ExportOnlyBranch(), (x,), strict=True)
        self.assertEqual(ep.module()(x), x + 100)
        compiled = torch.compile(_export_only_branch, backend="eager", fullgraph=True)
        self.assertEqual(compiled(x), x + 1)


class TestDynamoIsExportingStrictExport(torch._dynamo.test_case.TestCase):
    """torch.export traces the export-only branch, strict (both graph captures) or not."""

    @parametrize("legacy_capture", [True, False])
    def test_strict_export_sees_is_exporting(self, legacy_capture):
        x = torch.zeros(3)
        with torch._export.config.patch(use_legacy_dynamo_graph_capture=legacy_capture):
            ep = torch.export.export(_ExportOnlyBranch(), (x,), strict=True)
        self.assertEqual(ep.module()(x), x + 100)

    def test_non_strict_export_sees_is_exporting(self):
        x = torch.zeros(3)
        ep = torch.export.export(_ExportOnlyBranch(), (x,), strict=False)
        self.assertEqual(ep.module()(x), x + 100)


instantiate_parametrized_tests(TestDynamoIsExportingFolded)
instantiate_parametrized_tests(TestDynamoIsExportingStrictExport)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
