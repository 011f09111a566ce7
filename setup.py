"Packaging for coa_lib: everything is read from settings.ini (nbdev 2 convention)."
from configparser import ConfigParser
from pathlib import Path
import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).with_name("settings.ini"), encoding="utf-8")
cfg = cfg["DEFAULT"]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license=cfg["license"],
    keywords=cfg["keywords"].split(),
    packages=setuptools.find_packages(include=[cfg["lib_name"], cfg["lib_name"] + ".*"]),
    include_package_data=True,
    python_requires=">=" + cfg["min_python"],
    install_requires=cfg["requirements"].split(),
    extras_require={"dev": cfg["dev_requirements"].split()},
    zip_safe=False,
    entry_points={"nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
)
