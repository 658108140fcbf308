//! Finding where each client command ends in a stream of Redis requests,
//! so that a relay fault applies to one whole command.

/// Where each client command ends, in a stream of Redis requests (RESP
/// arrays of bulk strings, or inline commands ending with a newline), so
/// that a fault applies to one whole command however the reads cut it.
#[derive(Default)]
pub(super) struct Framer {
    /// The bytes of the command being read (or just completed).
    command: Vec<u8>,
    /// The header line being read (`*N` or `$L`), without its first byte.
    line: Vec<u8>,
    frame: Frame,
}

#[derive(Default, Clone, Copy)]
enum Frame {
    /// Before a command.
    #[default]
    Start,
    /// In an inline command, up to its newline.
    Inline,
    /// In the `*N` line of an array of `N` arguments.
    Count,
    /// In the `$L` line of an argument, `args` more after it.
    Header { args: u64 },
    /// In an argument: `bytes` more of it (its CRLF included), then `args`
    /// more arguments.
    Bulk { bytes: usize, args: u64 },
}

impl Framer {
    /// Reads `bytes` up to the end of the next command, if it ends within
    /// them: the offset just past it (its bytes are then [`Framer::command`]).
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            if let Frame::Bulk { bytes: left, args } = self.frame {
                let take = left.min(bytes.len() - i);
                self.command.extend_from_slice(&bytes[i..i + take]);
                i += take;
                self.frame = match (left - take, args) {
                    (0, 0) => Frame::Start,
                    (0, args) => self.header(args),
                    (left, args) => Frame::Bulk { bytes: left, args },
                };
                if matches!(self.frame, Frame::Start) {
                    return Some(i);
                }
                continue;
            }
            if matches!(self.frame, Frame::Start) {
                self.command.clear();
                self.frame = if b == b'*' {
                    self.line.clear();
                    Frame::Count
                } else {
                    Frame::Inline
                };
                self.command.push(b);
                i += 1;
                if b == b'\n' {
                    self.frame = Frame::Start;
                    return Some(i);
                }
                continue;
            }
            self.command.push(b);
            i += 1;
            match self.frame {
                Frame::Inline if b == b'\n' => {
                    self.frame = Frame::Start;
                    return Some(i);
                }
                Frame::Count | Frame::Header { .. } if b == b'\n' => {
                    let line = std::str::from_utf8(&self.line).unwrap_or("");
                    let number = line.trim_start_matches('$').trim_end().parse::<u64>();
                    self.frame = match (self.frame, number) {
                        (Frame::Count, Ok(args)) if args > 0 => self.header(args),
                        (Frame::Header { args }, Ok(len)) => Frame::Bulk {
                            bytes: usize::try_from(len).unwrap_or(usize::MAX).saturating_add(2),
                            args,
                        },
                        // An empty array, or a line that is not RESP: the
                        // command ends here.
                        _ => Frame::Start,
                    };
                    if matches!(self.frame, Frame::Start) {
                        return Some(i);
                    }
                }
                Frame::Count | Frame::Header { .. } => self.line.push(b),
                _ => {}
            }
        }
        None
    }

    /// Expects the `$L` line of one of `args` more arguments.
    fn header(&mut self, args: u64) -> Frame {
        self.line.clear();
        Frame::Header { args: args - 1 }
    }

    /// The bytes of the command [`Framer::feed`] last found the end of.
    pub(super) fn command(&self) -> &[u8] {
        &self.command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commands are found whole however the reads cut them, pipelined or not.
    #[test]
    fn frames_commands_across_reads() {
        let stream =
            b"*2\r\n$4\r\nPING\r\n$0\r\n\r\nPING\r\n*3\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n0\r\n";
        let expected: [&[u8]; 3] = [
            b"*2\r\n$4\r\nPING\r\n$0\r\n\r\n",
            b"PING\r\n",
            b"*3\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n0\r\n",
        ];
        for cut in 1..stream.len() {
            let mut framer = Framer::default();
            let mut found: Vec<Vec<u8>> = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                let mut at = 0;
                while let Some(end) = framer.feed(&part[at..]) {
                    at += end;
                    found.push(framer.command().to_vec());
                }
            }
            assert_eq!(found, expected, "cut at {cut}");
        }
    }
}
