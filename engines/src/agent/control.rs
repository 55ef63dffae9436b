//! The control channel: the messages of background processes between the host and
//! the agent (one JSON object per `SOCK_SEQPACKET` message, descriptors attached),
//! and the agent's reading and answering of them.

use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, OwnedFd};

use super::Agent;
use crate::host::sys;

/// fd 3 when the host passed a `SOCK_SEQPACKET` socket there: the control channel
/// (close-on-exec, so no command inherits it).
pub(super) fn channel() -> Option<OwnedFd> {
    sys::take_inherited_control_socket()
}

/// The largest control message (a spawn's argv and environment included).
pub(crate) const CONTROL_MESSAGE_MAX: usize = 128 * 1024;

/// One message on the control channel: a JSON object per `SOCK_SEQPACKET` message,
/// with `"v": 1` and the message's fields.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ControlFrame {
    /// The protocol version, 1.
    pub(crate) v: u32,
    /// The message.
    #[serde(flatten)]
    pub(crate) message: ControlMessage,
}

impl ControlFrame {
    /// `message` as bytes to send.
    pub(crate) fn encode(message: &ControlMessage) -> Vec<u8> {
        serde_json::to_vec(&ControlFrame {
            v: 1,
            message: message.clone(),
        })
        .expect("control messages serialize")
    }

    /// The message in `bytes`, if it is a version-1 control frame.
    pub(crate) fn decode(bytes: &[u8]) -> Result<ControlMessage, String> {
        let frame: ControlFrame = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if frame.v != 1 {
            return Err(format!("version {} is not 1", frame.v));
        }
        Ok(frame.message)
    }
}

/// A message on the control channel, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum ControlMessage {
    /// Host → agent: start a background process. Without `tty` three descriptors
    /// (stdin, stdout, stderr) come with the message; a `runner` gets a fourth, its
    /// fd 3 (the frames a warm runner writes).
    Spawn {
        id: String,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: String,
        /// (rows, cols) of a terminal the agent opens for it.
        tty: Option<(u16, u16)>,
        /// A warm runner (`docs/protocol.md`, section 13): `started` carries its
        /// pidfd, and a `sweep` spares it but not the rest of its session.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        runner: bool,
    },
    /// Host → agent: kill what a runner's turn left behind: every process of the
    /// container but the agent, the runners themselves and the sessions of the
    /// other background processes. Answered with `swept`.
    Sweep { id: String },
    /// Host → agent: signal the process group of a background process.
    Signal { id: String, signal: i32 },
    /// Agent → host: it runs as `pid` (in the container); a terminal's master, or a
    /// runner's pidfd, comes with the message.
    Started { id: String, pid: libc::pid_t },
    /// Agent → host: the sweep `id` is done; `killed` processes were found.
    Swept { id: String, killed: u32 },
    /// Agent → host: it could not start.
    Failed { id: String, message: String },
    /// Agent → host: it ended (and what it left in its session was killed).
    Exited {
        id: String,
        exit_code: i32,
        signal: Option<i32>,
    },
}

impl Agent {
    /// Reads and handles one control message.
    pub(super) fn read_control(&mut self) {
        let Some(sock) = self.control.as_ref() else {
            return;
        };
        let mut buf = vec![0u8; CONTROL_MESSAGE_MAX];
        let (n, fds) = match sys::recv_with_fds(sock, &mut buf) {
            Ok((0, _)) | Err(_) => {
                // The host closed it: no more background processes.
                self.control = None;
                return;
            }
            Ok(r) => r,
        };
        match ControlFrame::decode(&buf[..n]) {
            Ok(ControlMessage::Spawn {
                id,
                argv,
                env,
                cwd,
                tty,
                runner,
            }) => self.spawn_background(id, argv, env, cwd, (tty, runner), fds),
            Ok(ControlMessage::Sweep { id }) => {
                let killed = self.sweep();
                self.answer(&ControlMessage::Swept { id, killed }, None);
            }
            Ok(ControlMessage::Signal { id, signal }) => {
                if let Some(b) = self.background.iter().find(|b| b.id == id) {
                    // The group of a process not yet reaped.
                    sys::kill_group(b.pid, signal);
                }
            }
            Ok(other) => {
                eprintln!("paddock-agent: ignoring a control message for the host: {other:?}")
            }
            Err(e) => {
                eprintln!("paddock-agent: ignoring a control message that does not parse: {e}")
            }
        }
    }

    /// Sends `message` to the host, with `fd` attached.
    pub(super) fn answer(&self, message: &ControlMessage, fd: Option<BorrowedFd<'_>>) {
        if let Some(sock) = &self.control {
            let bytes = ControlFrame::encode(message);
            let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
            let _ = sys::send_with_fds(sock, &bytes, &fds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_round_trip_and_carry_the_version() {
        let spawn = ControlMessage::Spawn {
            id: "p1".into(),
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: BTreeMap::from([("A".into(), "1".into())]),
            cwd: "/workspace".into(),
            tty: Some((24, 80)),
            runner: false,
        };
        let bytes = ControlFrame::encode(&spawn);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.contains(r#""v":1"#) && text.contains(r#""kind":"spawn""#),
            "{text}"
        );
        assert_eq!(ControlFrame::decode(&bytes).unwrap(), spawn);
        assert!(
            !text.contains("runner"),
            "a plain spawn says nothing of runners: {text}"
        );
        let runner = ControlMessage::Spawn {
            id: "r1".into(),
            argv: vec!["python3".into(), "/tmp/.paddock-runners/python.py".into()],
            env: BTreeMap::new(),
            cwd: "/workspace".into(),
            tty: None,
            runner: true,
        };
        assert_eq!(
            ControlFrame::decode(&ControlFrame::encode(&runner)).unwrap(),
            runner
        );
        assert_eq!(
            ControlFrame::decode(br#"{"v":1,"kind":"sweep","id":"s1"}"#).unwrap(),
            ControlMessage::Sweep { id: "s1".into() }
        );
        let exited = br#"{"v":1,"kind":"exited","id":"p1","exit_code":137,"signal":9}"#;
        assert_eq!(
            ControlFrame::decode(exited).unwrap(),
            ControlMessage::Exited {
                id: "p1".into(),
                exit_code: 137,
                signal: Some(9)
            }
        );
        assert!(ControlFrame::decode(br#"{"v":2,"kind":"signal","id":"p1","signal":9}"#).is_err());
        assert!(ControlFrame::decode(br#"{"v":1,"kind":"bogus"}"#).is_err());
        assert!(ControlFrame::decode(b"not json").is_err());
    }
}
