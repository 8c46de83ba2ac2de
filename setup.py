"""Ships ``cf_tasks_autoload.pth`` into site-packages, for regular and editable installs alike
(setuptools has no setting for a top-level .pth file; the metadata is in pyproject.toml), and
builds every wheel from a clean ``build/lib``.

setuptools copies the modules into ``build/lib`` and packs whatever that folder holds into the
wheel, so a file left there by an earlier build of another checkout (a module since renamed or
removed) would be installed again. ``build_py`` empties the folder first.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "cf_tasks_autoload.pth"


class build_py_with_pth(build_py):
    """build_py, plus the start-up hook that lets plain ``lm_eval --tasks cf_bio`` find the tasks
    (cf_tasks_autoload.py says what it does). The file goes to the wheel's root, which pip installs
    into site-packages and lists in RECORD, so ``pip uninstall cf-tasks`` removes it."""

    def run(self):
        if not self.editable_mode:
            self.clean_build_lib()
        super().run()
        # An editable wheel is assembled from the install command's folder, not from build_lib.
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        os.makedirs(root, exist_ok=True)
        self.copy_file(PTH, os.path.join(root, PTH), preserve_mode=False)

    def clean_build_lib(self):
        """Empty ``build_lib`` when it lies inside the build folder (``build/lib``): it holds only
        what an earlier build copied there."""
        base = os.path.abspath(self.get_finalized_command("build").build_base)
        lib = os.path.abspath(self.build_lib)
        if lib != base and os.path.commonpath([base, lib]) == base and os.path.isdir(lib):
            shutil.rmtree(lib)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": build_py_with_pth})
