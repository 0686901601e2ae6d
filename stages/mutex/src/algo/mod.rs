//! The algorithms, one per module. Each is a [`crate::MutexNode`]; each module's docs state the
//! algorithm's channel needs, its fencing-token scheme and the decisions taken on open points of
//! the spec (`specs/mutex-classic.md`).

pub mod centralized;
pub mod lamport;
pub mod maekawa;
pub mod misra;
pub mod naimi_trehel;
pub mod raymond;
pub mod ricart_agrawala;
pub mod roucairol_carvalho;
pub mod suzuki_kasami;
pub mod token_ring;

pub use centralized::{Centralized, CentralizedConfig, CentralizedMsg};
pub use lamport::{Lamport, LamportConfig, LamportMsg};
pub use maekawa::{Maekawa, MaekawaConfig, MaekawaMsg, MaekawaVariant};
pub use misra::{Misra, MisraConfig, MisraMsg};
pub use naimi_trehel::{NaimiTrehel, NaimiTrehelConfig, NaimiTrehelMsg};
pub use raymond::{Raymond, RaymondConfig, RaymondMsg};
pub use ricart_agrawala::{RicartAgrawala, RicartAgrawalaConfig, RicartAgrawalaMsg};
pub use roucairol_carvalho::{RoucairolCarvalho, RoucairolCarvalhoConfig, RoucairolCarvalhoMsg};
pub use suzuki_kasami::{SkToken, SuzukiKasami, SuzukiKasamiConfig, SuzukiKasamiMsg};
pub use token_ring::{TokenRing, TokenRingConfig, TokenRingMsg};
