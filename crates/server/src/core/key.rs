//! Which shuffle a piece of state belongs to.

/// Which shuffle: an application's id and its shuffle number.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShuffleKey {
    app_id: String,
    shuffle_id: u32,
}

impl ShuffleKey {
    /// Shuffle `shuffle_id` of application `app_id`.
    pub fn new(app_id: &str, shuffle_id: u32) -> ShuffleKey {
        ShuffleKey { app_id: app_id.to_owned(), shuffle_id }
    }

    /// The application's id.
    pub fn app_id(&self) -> &str {
        &self.app_id
    }

    /// The shuffle's number within its application.
    pub fn shuffle_id(&self) -> u32 {
        self.shuffle_id
    }
}

impl std::fmt::Display for ShuffleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shuffle {} of {}", self.shuffle_id, self.app_id)
    }
}
