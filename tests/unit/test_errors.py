import pytest

from execbox import errors


@pytest.mark.parametrize("cls,code,status", [
    (errors.ProviderNotInitializedError, "SB001", 503),
    (errors.InvalidConfigError, "SB002", 400),
    (errors.ConnectionFailedError, "SB003", 502),
    (errors.InstanceCreationError, "SB004", 503),
    (errors.ExecutionTimeoutError, "SB005", 408),
    (errors.OutOfMemoryError, "SB006", 422),
    (errors.CodeBlockedError, "SB007", 400),
    (errors.RateLimitError, "SB008", 429),
    (errors.ProviderUnavailableError, "SB009", 503),
])
def test_each_code_has_its_status_and_shape(cls, code, status):
    err = cls("boom", details={"k": 1})
    assert err.code == code and err.http_status == status
    assert err.to_dict() == {"error": {"code": code, "message": "boom", "details": {"k": 1}}}
    assert str(err) == f"{code}: boom"
    again = errors.error_from_dict(err.to_dict(), http_status=status)
    assert type(again) is cls and again.details == {"k": 1}


def test_table_is_complete():
    assert sorted(errors.ERRORS_BY_CODE) == [f"SB00{i}" for i in range(1, 10)]


def test_refinements_keep_code_change_status():
    assert errors.FileNotFoundInSandbox("x").code == "SB002"
    assert errors.FileNotFoundInSandbox("x").http_status == 404
    assert errors.PayloadTooLargeError("x").http_status == 413
    assert errors.InvalidConfigError("x", http_status=401).http_status == 401
