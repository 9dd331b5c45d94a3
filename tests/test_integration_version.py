"""The integration is picked by torchtitan's version; any other version is refused naming the supported ones.
Runs next to either torchtitan (scripts/test.sh runs it in both environments)."""

import pytest

from titan_fp4six.integration import version


@pytest.mark.parametrize("given, series", [("0.2.2", "0.2"), ("0.3.0", "0.3"), ("0.3.1.dev0", "0.3")])
def test_supported_versions_pick_their_integration(given, series):
    assert version.series(given) == series


@pytest.mark.parametrize("given", ["0.1.0", "0.4.0", "1.0"])
def test_an_unsupported_version_is_refused_naming_the_supported_ones(given):
    with pytest.raises(ImportError, match=rf"torchtitan {given} is installed; titan_fp4six supports torchtitan 0\.2\.x "
                                          r".*--job\.config_file.*torchtitan 0\.3\.x .*--module titan_fp4six"):
        version.series(given)


def test_the_other_versions_integration_refuses_to_load():
    """job_config (0.2) next to 0.3, tt03 next to 0.2: an error naming the entry for the installed version."""
    if version.series() == "0.2":
        with pytest.raises(ImportError, match=r"integration for torchtitan 0\.3\.x, but torchtitan 0\.2\.\d+ is "
                                              r"installed: use torchtitan 0\.2\.x \(--job\.config_file"):
            import titan_fp4six.integration.tt03  # noqa: F401
    else:
        with pytest.raises(ImportError, match=r"integration for torchtitan 0\.2\.x, but torchtitan 0\.3\.\d+ is "
                                              r"installed: use torchtitan 0\.3\.x \(--module"):
            import titan_fp4six.integration.job_config  # noqa: F401
