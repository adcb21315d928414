//! The stand-in NVIDIA device for the ioctl tests.
use std::{path::PathBuf, process::Command};

use crate::fixtures;

/// The stand-in NVIDIA device (a FUSE server), mounted for one test.
pub struct FakeDevice {
    pub dir: PathBuf,
    server: std::process::Child,
}

impl FakeDevice {
    /// Mounts `server` (the fake_nvidia_dev binary) on a fresh directory.
    pub fn mount(server: &str, name: &str) -> FakeDevice {
        let dir = fixtures().dir.join(format!("nvdev-{name}"));
        // A mount left by an earlier run that died.
        let _ = Command::new("umount").arg("-l").arg(&dir).stderr(std::process::Stdio::null()).status();
        std::fs::create_dir_all(&dir).unwrap();
        let server = Command::new(server).arg(&dir).spawn().expect("starting the stand-in NVIDIA device");
        // Owned at once: dropping the device kills and reaps the server, on every path.
        let device = FakeDevice { dir, server };
        let ctl = device.dir.join("nvidiactl");
        let what = format!("the stand-in device at {}", device.dir.display());
        crate::poll(5, &what, || ctl.exists().then_some(()), String::new);
        device
    }

    /// The `--nvidia-dev-prefix` that names its nodes.
    pub fn prefix(&self) -> String {
        format!("{}/nvidia", self.dir.display())
    }
}

impl Drop for FakeDevice {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.dir).stderr(std::process::Stdio::null()).status();
    }
}
