"""Package layout: one import package, ``moeplane``, mapped onto the repository's folders.

``moeplane/`` holds the package root and the public SDK module; ``controlplane/``, ``agents/``,
``dashboard/`` and ``migrations/`` install as ``moeplane.controlplane`` and so on. Everything
else (metadata, dependencies, package data) is in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = ("controlplane", "agents", "dashboard", "migrations")

package_dir = {"moeplane": "moeplane"}
packages = ["moeplane"]
for folder in FOLDERS:
    package_dir[f"moeplane.{folder}"] = folder
    packages.append(f"moeplane.{folder}")
    packages += [f"moeplane.{folder}.{sub}" for sub in find_packages(folder)]

setup(package_dir=package_dir, packages=packages)
