//! Resetting one GPU through the driver's per-GPU recovery interface, when
//! the node's remediation asks for it (`gpuResetFirst`).
//!
//! Two ways, chosen by the agent's `--gpu-reset` flag:
//! - [`GpuReset::Debugfs`] (the default): amdgpu's debugfs file
//!   `amdgpu_gpu_recover`; reading it makes the driver recover (reset) that
//!   GPU and returns once the recovery ran. It lives under
//!   `/sys/kernel/debug/dri/<PCI address>/` on newer kernels and
//!   `/sys/kernel/debug/dri/<card minor>/` on older ones; both are tried,
//!   through the host's bounded reader (a recovery can hang: it is bounded
//!   like every host read). debugfs must be mounted in the host root.
//! - [`GpuReset::Command`]: a program (`amd-smi reset -G -g`, a site's own
//!   script), run with the GPU's PCI address as its last argument.
//!
//! On a GPU joined to others by XGMI, the driver resets the whole hive: the
//! entry opts in knowing that. This module must not decide when to reset.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::command::{self, Invocation, Sink};
use crate::device::Gpu;
use crate::host::reader::BoundedReader;

/// How long a reset may take.
pub const RESET_TIMEOUT: Duration = Duration::from_secs(120);
/// amdgpu's debugfs recovery file.
pub const RECOVER_FILE: &str = "amdgpu_gpu_recover";
const DEBUGFS_DRI: &str = "/sys/kernel/debug/dri";
/// How long looking for the file may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// How a GPU is reset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum GpuReset {
    #[default]
    Debugfs,
    Command {
        program: PathBuf,
        args: Vec<OsString>,
    },
}

impl GpuReset {
    /// `debugfs`, or a command line (split at whitespace).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim() == "debugfs" {
            return Ok(Self::Debugfs);
        }
        let (program, args) = command::split_line(text, "the GPU reset command")?;
        Ok(Self::Command { program, args })
    }
}

/// Where the GPU's recovery file may be, newest layout first. Pure.
pub fn recover_paths(gpu: &Gpu) -> Vec<String> {
    let mut paths = vec![format!("{DEBUGFS_DRI}/{}/{RECOVER_FILE}", gpu.bdf)];
    if let Some(card) = gpu.card {
        paths.push(format!("{DEBUGFS_DRI}/{card}/{RECOVER_FILE}"));
    }
    paths
}

/// Resets `gpu`. `Ok` says how; `Err` why it could not be done.
pub async fn reset(method: &GpuReset, reader: &BoundedReader, gpu: &Gpu) -> Result<String, String> {
    match method {
        GpuReset::Debugfs => {
            for path in recover_paths(gpu) {
                match reader.exists(&path, LOOKUP_TIMEOUT).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => return Err(format!("{path}: {e}")),
                }
                tracing::warn!(gpu = %gpu.bdf, %path, "resetting the GPU through amdgpu's debugfs");
                return reader
                    .read_attr(&path, RESET_TIMEOUT)
                    .await
                    .map(|_| format!("reset through {path}"))
                    .map_err(|e| format!("{path}: {e}"));
            }
            Err(format!(
                "no {RECOVER_FILE} for GPU {} under {DEBUGFS_DRI} (is debugfs mounted in the host root? \
                 or give the agent --gpu-reset COMMAND)",
                gpu.bdf
            ))
        }
        GpuReset::Command { program, args } => {
            let mut args = args.clone();
            args.push(OsString::from(&gpu.bdf));
            let invocation = Invocation {
                program: program.clone(),
                args,
                ..Invocation::default()
            };
            tracing::warn!(gpu = %gpu.bdf, program = %program.display(), "resetting the GPU");
            let done = command::run(
                &invocation,
                Sink::Discard,
                Sink::Memory(4096),
                RESET_TIMEOUT,
                None,
            )
            .await;
            let name = program.display();
            match done.failure(RESET_TIMEOUT) {
                None => Ok(format!("reset by {name}")),
                Some(why) => Err(format!("{name}: {why}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostRoot;

    fn gpu(bdf: &str, card: Option<u32>) -> Gpu {
        Gpu {
            bdf: bdf.into(),
            card,
            ..Gpu::default()
        }
    }

    #[test]
    fn debugfs_is_the_default_and_a_command_is_split() {
        assert_eq!(GpuReset::parse("debugfs").unwrap(), GpuReset::Debugfs);
        assert_eq!(
            GpuReset::parse("amd-smi reset -G -g").unwrap(),
            GpuReset::Command {
                program: "amd-smi".into(),
                args: ["reset", "-G", "-g"].map(OsString::from).to_vec(),
            }
        );
        assert!(GpuReset::parse(" ").is_err());
    }

    #[tokio::test]
    async fn the_debugfs_file_is_found_by_address_or_card_and_its_absence_explained() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let reader = BoundedReader::new(host.clone(), 1);
        let by_card = gpu("0000:03:00.0", Some(1));
        let missing = reset(&GpuReset::Debugfs, &reader, &by_card)
            .await
            .unwrap_err();
        assert!(missing.contains("is debugfs mounted"), "{missing}");
        let file = host.path(format!("{DEBUGFS_DRI}/1/{RECOVER_FILE}"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "gpu recover\n").unwrap();
        let done = reset(&GpuReset::Debugfs, &reader, &by_card).await.unwrap();
        assert!(done.contains("/sys/kernel/debug/dri/1/"), "{done}");
        let by_address = host.path(format!("{DEBUGFS_DRI}/0000:03:00.0/{RECOVER_FILE}"));
        std::fs::create_dir_all(by_address.parent().unwrap()).unwrap();
        std::fs::write(&by_address, "gpu recover\n").unwrap();
        let done = reset(&GpuReset::Debugfs, &reader, &by_card).await.unwrap();
        assert!(
            done.contains("/dri/0000:03:00.0/"),
            "the newer layout first: {done}"
        );
    }

    #[tokio::test]
    async fn a_command_gets_the_address_and_its_failure_is_told() {
        let ok = GpuReset::parse("true").unwrap();
        let reader = BoundedReader::new(HostRoot::new("/nonexistent"), 1);
        let g = gpu("0000:03:00.0", None);
        assert!(reset(&ok, &reader, &g).await.is_ok());
        let failing = GpuReset::parse("false").unwrap();
        assert!(reset(&failing, &reader, &g).await.is_err());
        let echo = GpuReset::Command {
            program: "sh".into(),
            args: ["-c", "echo \"$0\" >&2; exit 1"]
                .map(OsString::from)
                .to_vec(),
        };
        let why = reset(&echo, &reader, &g).await.unwrap_err();
        assert!(
            why.contains("0000:03:00.0"),
            "the address is the last argument: {why}"
        );
    }
}
