//! The CUDA writer on a machine without a CUDA driver: a clear error, not a panic.
#![cfg(feature = "cuda")]

use hspack::capture::cuda::{driver_version, CaptureError, CudaWriter, CudaWriterOptions};
use hspack::{DType, Field, Role, Schema};

fn has_driver() -> bool {
    driver_version().is_ok()
}

#[test]
fn open_without_driver_reports_no_driver() {
    if has_driver() {
        eprintln!("SKIP: a CUDA driver is present here; the no-driver error is checked on machines without one");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new(vec![Field::new("hidden.0", DType::BF16, &[8], Role::Other)]);
    let err =
        CudaWriter::open(dir.path().join("ds"), schema, CudaWriterOptions::default()).unwrap_err();
    match &err {
        CaptureError::NoDriver { library, .. } => assert!(!library.is_empty()),
        other => panic!("expected NoDriver, got {other:?}"),
    }
    assert!(
        err.to_string().starts_with("no CUDA driver: cannot load "),
        "{err}"
    );
    // Nothing was created: the driver is checked before the dataset is touched.
    assert!(!dir.path().join("ds").exists());
    // Asking again gives the same answer.
    assert!(matches!(
        driver_version(),
        Err(CaptureError::NoDriver { .. })
    ));
}
